"""Benchmark: what each throughput design buys, as ratios of two ways measured in one run, on real ScienceWorld.

    python benchmarks/bench.py [--task power-component] [--group 8] [--steps 30] [--decoding constrained]
                          [--with-naive] [--with-repeated-tips] [--with-compile] [--quick]
    .venv-vllm/bin/python benchmarks/bench.py --engines [--quick]     # section 6 alone (make vllm-check builds it)

Prints, for the laptop model (SmolLM2-135M, LoRA r8) on 2 CPU cores:
  0. the machine: threads, and memory read bandwidth (a sum over 512 MB);
  1. one group rollout (temperature 1, fixed seed) in each KV cache layout: ragged (each
     row its own length, each row's attention reading only its own entries; the one training
     uses), padded (written in place, finished episodes not computed) and plain (copied at every
     call, every row computed), both in benchmarks/cache_layouts.py; with --with-naive also
     re-encoding the history at every step;
     do the ways play the same episodes? The cache positions a decode step reads, and the
     share of them that are holes (padding, and rows shorter than the longest);
  2. one decode step over each rollout's cache, against the memory-bandwidth bound
     (the weights + the rows' real KV entries read once, at the measured bandwidth), and two
     levers measured on the padded cache and not kept (the LoRA adapter merged into the
     weights, eager attention); with --with-compile, torch.compile of a decode step over
     transformers' StaticCache (not kept either);
  3. the group's environment steps (the rollout's actions replayed) one after the
     other vs at the same time from threads (one JVM per environment);
  4. one packed update pass over the longest episode: tokens per second, and attention's share
     (forward and backward) of it; with --with-naive, the packed pass vs one pass per turn;
  5. whole iterations through the trainer (p = 0.5, so memory is exercised), EMPO² and GRPO at the laptop
     profile (each retrieved tip shown once; --with-repeated-tips adds the paper's every-step top_k):
     where the time goes, how many tokens the episodes carry (and how many are tips), and
     the iteration's update run twice on its own episodes (θ_old reused vs a separate pass).
  6. with --engines (and vLLM installed), only this: the vLLM engine, with either weight sync (the merged
     weights reloaded in place, or the LoRA adapter under a new id), beside the default one (the policy
     itself, ragged cache) on the same first-turn prompts — a prefill (one token), a decode step (free text),
     and the first call after the weights changed (the sync, then a prefill anew) — and two GRPO iterations
     through the trainer on each.
The goals each figure is held against are printed beside it. --quick: group 4, 10 steps.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import tempfile
import time

import numpy as np
import torch

from empo2.config import EMPO2Config
from empo2.envs import env_from_config
from empo2.episode import PLAIN
from empo2.llm.generation import GroupGenerator
from empo2.llm.logprobs import episode_logprobs, tokens_processed
from empo2.llm.models import load_policy
from empo2.method.rollout import call_each

from cache_layouts import LAYOUTS, LayoutRoller, PaddedGenerator, cache_positions  # beside this file


def read_bandwidth_gb_s(megabytes: int = 512, repeats: int = 5) -> float:
    """Memory read bandwidth: summing a tensor far larger than the caches, best of `repeats`."""
    values = torch.ones(megabytes * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        values.sum()
        best = min(best, time.perf_counter() - start)
    return values.numel() * 4 / best / 1e9


def laptop_config(args, **overrides) -> EMPO2Config:
    return EMPO2Config.from_profile("laptop", task=args.task, group_size=args.group, max_steps=args.steps,
                                    response_tokens=args.tokens, action_decoding=args.decoding, **overrides)


def rollout(model, tokenizer, envs, variation, args, *, cache_layout: str = "ragged", reuse_cache: bool = True):
    """One group rollout at temperature 1 from a fixed seed: both ways draw the same samples from the same logits."""
    roller = LayoutRoller.from_config(laptop_config(args, reuse_cache=reuse_cache), model, tokenizer,
                                      sampling_rng=torch.Generator().manual_seed(0))
    roller.generator_class = LAYOUTS[cache_layout]
    roller.parallel_envs = False  # environment steps are compared in section 3
    start = time.perf_counter()
    episodes = roller.run(envs, [variation] * len(envs), [PLAIN] * len(envs), temperature=1.0)
    return episodes, roller, time.perf_counter() - start


def logprob_gap(a, b) -> float:
    """Largest |log-prob difference| of two plays of one episode, over the turns until their actions differ."""
    gap = 0.0
    for turn_a, turn_b in zip(a.turns, b.turns):
        if turn_a.response_ids != turn_b.response_ids:
            break
        gap = max([gap] + [abs(x - y) for x, y in zip(turn_a.behaviour_logprobs, turn_b.behaviour_logprobs)])
    return gap


def decode_step_ms(generator, steps: int = 8) -> float:
    """Mean time of a one-token step for every row of `generator`'s cache (the tokens are arbitrary)."""
    slots = list(generator.rows)
    token = generator.stop_id
    with torch.no_grad():
        if isinstance(generator, PaddedGenerator):  # every row computed (the ragged cache computes the rows it feeds)
            generator._bring_forward(set(slots))
        generator._feed({slot: [token] for slot in slots})  # warm-up
        start = time.perf_counter()
        for _ in range(steps):
            generator._feed({slot: [token] for slot in slots})
    return (time.perf_counter() - start) / steps * 1000


def decode_levers(model, generator) -> dict[str, tuple[float, float]]:
    """Decode step over `generator`'s cache with two levers measured and not kept: the LoRA adapter merged
    into the bf16 weights (no adapter matmuls) and transformers' eager attention instead of sdpa.
    Returns name -> (ms, max |log-prob difference| of one step against the LoRA model as kept, over the
    tokens it gives at least 1%)."""
    base = model.get_base_model()
    slots = list(generator.rows)

    def step_logprobs():
        snapshot = [(layer.length, layer.key_buffer.clone(), layer.value_buffer.clone())
                    for layer in generator.cache.layers]
        mask, fed = generator.mask.clone(), {slot: list(ids) for slot, ids in generator.fed.items()}
        with torch.no_grad():
            logprobs = torch.log_softmax(generator._feed({slot: [generator.stop_id] for slot in slots}), dim=-1)
        for layer, (length, keys, values) in zip(generator.cache.layers, snapshot):  # undo the step
            layer.length, layer.key_buffer, layer.value_buffer = length, keys, values
        generator.mask, generator.fed = mask, fed
        return logprobs

    @contextlib.contextmanager
    def merged():
        # Unmerging in bf16 does not give the base weights back exactly, so they are restored from a copy.
        saved = {name: p.detach().clone() for name, p in model.named_parameters() if "base_layer" in name}
        model.merge_adapter()
        try:
            yield
        finally:
            model.unmerge_adapter()
            named = dict(model.named_parameters())
            with torch.no_grad():
                for name, value in saved.items():
                    named[name].copy_(value)

    @contextlib.contextmanager
    def eager():
        base.set_attn_implementation("eager")
        try:
            yield
        finally:
            base.set_attn_implementation("sdpa")

    variants = {"LoRA adapter (kept)": contextlib.nullcontext, "adapter merged into bf16 weights": merged,
                "eager attention": eager}
    logprobs = {}
    for name, variant in variants.items():  # all at the same cache state (timing below advances it)
        with variant():
            logprobs[name] = step_logprobs()
    results = {}
    for name, variant in variants.items():
        with variant():
            reference = logprobs["LoRA adapter (kept)"]  # (rows, vocab)
            likely = reference > math.log(0.01)  # the tokens that get sampled: probability at least 1%
            gap = float((logprobs[name] - reference).abs()[likely].max())
            results[name] = (decode_step_ms(generator), gap)
    return results


def compiled_decode_lever(model, tokenizer, rows: int, length: int, steps: int = 8) -> dict[str, float]:
    """A decode step over `rows` synthetic prompts of `length` tokens three ways: our ragged cache, transformers'
    StaticCache eager, and the same StaticCache step under torch.compile (fixed shapes). Returns name -> ms per
    step, plus the seconds of the first compiled call (the compilation) and the compiled step's largest
    |log-prob difference| from the eager one (tokens of probability >= 1%)."""
    from transformers import StaticCache

    prompts = torch.randint(1000, 20000, (rows, length), sampling_rng=torch.Generator().manual_seed(0))
    token = tokenizer.eos_token_id
    results, last = {}, {}
    generator = GroupGenerator(model, tokenizer, rows)
    with torch.no_grad():
        generator._feed({row: prompts[row].tolist() for row in range(rows)})
    results["ragged cache (kept)"] = decode_step_ms(generator, steps)
    for name, compiled in (("StaticCache, eager", False), ("StaticCache, torch.compile", True)):
        cache = StaticCache(config=model.config, max_cache_len=length + steps + 2)
        forward = torch.compile(model.forward, dynamic=False) if compiled else model.forward
        times = []
        with torch.no_grad():
            model(input_ids=prompts, past_key_values=cache, use_cache=True, cache_position=torch.arange(length))
            for i in range(steps + 2):
                position = torch.tensor([length + i])
                start = time.perf_counter()
                out = forward(input_ids=torch.full((rows, 1), token), past_key_values=cache, use_cache=True,
                              cache_position=position, position_ids=position.expand(rows, 1))
                times.append(time.perf_counter() - start)
            last[name] = torch.log_softmax(out.logits[:, -1].float(), dim=-1)  # (rows, vocab)
        results[name] = sum(times[2:]) / steps * 1000
        if compiled:
            results["compile seconds"] = times[0]
    eager = last["StaticCache, eager"]
    results["compiled log-prob gap"] = float((last["StaticCache, torch.compile"] - eager).abs()[eager > math.log(0.01)].max())
    return results


def update_pass_split(model, episode) -> tuple[float, float, float]:
    """One packed forward + backward over `episode` (tip-free): (seconds, attention's share of the CPU time,
    attention backward over attention forward), the shares from torch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    was_training = model.training
    model.train()
    episode_logprobs(model, episode, with_tips=False).sum().backward()  # warm-up
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        episode_logprobs(model, episode, with_tips=False).sum().backward()
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    events = profiler.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    forward = sum(e.self_cpu_time_total for e in events if e.key == "aten::_scaled_dot_product_flash_attention_for_cpu")
    backward = sum(e.self_cpu_time_total for e in events
                   if e.key.startswith("aten::_scaled_dot_product_flash_attention_for_cpu_backward"))
    return seconds, (forward + backward) / total, backward / max(forward, 1)


def replay_seconds(envs, variation, episodes, parallel: bool) -> float:
    """Seconds of environment calls to replay `episodes`' executed actions, the group stepping together."""
    start = time.perf_counter()
    call_each(envs, [(env.reset, variation) for env in envs], parallel=parallel)
    for step in range(max(len(e.turns) for e in episodes)):
        going = [i for i, e in enumerate(episodes) if step < len(e.turns)]
        call_each([envs[i] for i in going], [(envs[i].step, episodes[i].turns[step].executed_action) for i in going],
                  parallel=parallel)
    return time.perf_counter() - start


@contextlib.contextmanager
def separate_old_pass(update):
    """`update` scoring θ_old in a separate no-grad pass for every episode (the plain way), none of them taken
    from its first gradient pass."""
    update.old_from_first_pass = lambda episodes, first_minibatch: set()
    try:
        yield
    finally:
        del update.old_from_first_pass  # the class's own again


def iteration(args, method: str, **overrides) -> tuple[dict, dict]:
    """The second iteration of a trainer (the first fills the memory), one training variation: its metrics, and its
    update timed both ways.

    The update is run on the iteration's own episodes from the same weights, optimiser state and random
    state twice: θ_old from the first gradient pass, then a separate no-grad pass (the plain way).
    """
    from empo2.method.trainer import Trainer

    with tempfile.TemporaryDirectory() as folder:
        # One training variation: the memory is per variation, so the second iteration retrieves the first's tips.
        cfg = laptop_config(args, method=method, results_dir=folder, iterations=2, eval_every=100, checkpoint_every=0,
                            n_train_variations=1, **({"p": 0.5} if method == "empo2" else {}), **overrides)
        with Trainer(cfg, show_progress=False) as trainer:
            trainer.train_iteration()
            update, extra = trainer.update, {}

            def timed_both_ways(episodes, advantages, decisions=None):
                saved = ({n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad},
                         copy.deepcopy(update.optimizer.state_dict()), copy.deepcopy(trainer.rng.bit_generator.state))
                start = time.perf_counter()
                with separate_old_pass(update):
                    plain = update(episodes, advantages, decisions)
                extra["plain update seconds"] = time.perf_counter() - start
                extra["plain tokens read"] = plain.get("update/tokens_read_per_trajectory_token", float("nan"))
                named = dict(trainer.model.named_parameters())
                with torch.no_grad():
                    for name, value in saved[0].items():
                        named[name].copy_(value)
                update.optimizer.load_state_dict(saved[1])
                trainer.rng.bit_generator.state = saved[2]
                extra["context tokens"] = sum(len(e.turns[-1].prompt_ids) + len(e.turns[-1].response_ids)
                                              for e in episodes)
                extra["tip-free tokens"] = sum(len(e.turns[-1].prompt_ids_tip_free) + len(e.turns[-1].response_ids)
                                               for e in episodes)
                start = time.perf_counter()
                metrics = update(episodes, advantages, decisions)  # the run continues from this one
                extra["update seconds"] = time.perf_counter() - start
                return metrics

            trainer.update = timed_both_ways
            metrics = trainer.train_iteration()
            # The iteration as training runs it: without the extra plain-way update made for the comparison.
            metrics["time/update"] = extra["update seconds"]
            metrics["time/iteration"] -= extra["plain update seconds"]
            return metrics, extra


def first_turn_prompts(tokenizer, envs, variation) -> dict[int, list[int]]:
    """The group's first-turn prompts (system prompt, task, first observation) as token ids."""
    from empo2.chat import ChatFormat, Message
    from empo2.prompts import SYSTEM_PROMPT

    prompts = {}
    for slot, env in enumerate(envs):
        observation, info = env.reset(variation)
        messages = [Message("system", SYSTEM_PROMPT),
                    Message("user", env.first_turn_text(info.get("task_description", ""), observation, info))]
        prompts[slot] = ChatFormat(tokenizer).render(messages, add_generation_prompt=True).ids()
    return prompts


def engine_comparison(args, model, tokenizer, envs, variation) -> None:
    """Section 6: prefill, decode and a weight change on the default engine and on vLLM with each weight sync,
    then two GRPO iterations through the trainer on each."""
    from empo2.method.trainer import Trainer
    from empo2.llm.vllm_check import stand_in_adapter
    from empo2.config import CHOICES
    from empo2.llm.vllm_engine import VLLMEngine

    # Output is flushed at once: vLLM forks workers, which would print a buffered copy again on exit. The engines'
    # KV caches get 2 GiB (93k tokens, a group's conversations need under 20k): this process holds the policy twice.
    prompts = first_turn_prompts(tokenizer, envs, variation)
    print(f"\n6. rollout engines, {len(prompts)} first-turn prompts of about {round(np.mean([len(p) for p in prompts.values()]))} "
          f"tokens; the policy's LoRA adapter (rank 8) is trained, so its B matrices are not zero", flush=True)
    draw = torch.Generator().manual_seed(0)
    stand_in_adapter(model, 0.01, draw)
    engines = {"transformers": dict(rollout_engine="transformers")} | {
        f"vllm {sync}": dict(rollout_engine="vllm", vllm_weight_sync=sync, vllm_cpu_kv_cache_gib=2) for sync in CHOICES["vllm_weight_sync"]}
    new_tokens = 33
    prefill, decode, changed = {}, {}, {}

    def timed(generator, tokens, asked=prompts) -> tuple[float, int]:
        """Seconds of one call, and its longest response (a free response may end before `tokens`)."""
        start = time.perf_counter()
        responses = generator.generate(asked, tokens)
        return time.perf_counter() - start, max(len(r.ids) for r in responses.values())

    def optimiser_step() -> None:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.add_(1e-4 * torch.randn(parameter.shape, generator=draw))

    one, _ = timed(GroupGenerator(model, tokenizer, len(prompts), temperature=1.0), 1)
    longer, length = timed(GroupGenerator(model, tokenizer, len(prompts), temperature=1.0), new_tokens)
    prefill["transformers"], decode["transformers"] = one, (longer - one) / max(1, length - 1)
    changed["transformers"] = one  # the policy itself needs no sync: a first call prefills as ever
    for name, settings in list(engines.items())[1:]:
        started = time.perf_counter()
        engine = VLLMEngine.from_config(laptop_config(args, method="grpo", **settings), tokenizer)
        print(f"   {name}: started in {time.perf_counter() - started:.0f} s", flush=True)
        generator = engine.generator(model, len(prompts), temperature=1.0)
        timed(generator, 1, {slot: [p[0] + 1] + p[1:] for slot, p in prompts.items()})  # loads the weights, caches nothing reused
        prefill[name], _ = timed(generator, 1)
        cached, _ = timed(generator, 1)  # the prompts are in vLLM's prefix cache now, so both calls below skip the prefill
        longer, length = timed(generator, new_tokens)
        decode[name] = (longer - cached) / max(1, length - 1)
        optimiser_step()
        start = time.perf_counter()
        timed(engine.generator(model, len(prompts), temperature=1.0), 1)  # the sync, then the prompts prefilled anew
        changed[name] = time.perf_counter() - start
        engine.close()
    for name in prefill:
        print(f"   {name:15s} prefill {prefill[name]:6.2f} s, decode step {1000 * decode[name]:6.1f} ms (batch "
              f"{len(prompts)}), first call after the weights changed {changed[name]:6.2f} s", flush=True)
    for name in list(prefill)[1:]:
        print(f"   {name} vs the default engine: prefill {prefill['transformers'] / prefill[name]:.2f}x faster, decode "
              f"step {decode['transformers'] / decode[name]:.2f}x faster", flush=True)
    print(f"   weights vs adapter sync: decode step {decode['vllm adapter'] / decode['vllm weights']:.2f}x faster, first "
          f"call after a change {changed['vllm adapter'] / changed['vllm weights']:.2f}x faster", flush=True)
    iterations = {}
    for name, settings in engines.items():
        with tempfile.TemporaryDirectory() as folder:
            config = laptop_config(args, method="grpo", results_dir=folder, iterations=2, eval_every=100,
                                   checkpoint_every=0, n_train_variations=1, **settings)
            with Trainer(config, show_progress=False) as trainer:
                iterations[name] = [trainer.train_iteration() for _ in range(2)]
    for name, rows in iterations.items():
        for i, m in enumerate(rows, 1):
            print(f"   {name:15s} iteration {i}: {m['time/iteration']:6.1f} s (rollout {m['time/rollout']:6.1f}, generation "
                  f"{m['time/generation']:6.1f}, update {m['time/update']:5.1f}), {m['train/steps']:.1f} steps an episode")
    total = {name: sum(m["time/iteration"] for m in rows) for name, rows in iterations.items()}
    for name in list(total)[1:]:
        print(f"   {name} vs the default engine over the two iterations: {total['transformers'] / total[name]:.2f}x faster "
              "(episodes differ: another sampler)")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="power-component")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=12, help="response token limit (free text)")
    parser.add_argument("--decoding", default="constrained", choices=("free", "constrained"))
    parser.add_argument("--with-naive", action="store_true",
                        help="also re-encode the history every step and score one pass per turn (slow: O(T^2))")
    parser.add_argument("--with-repeated-tips", action="store_true",
                        help="also time EMPO2 showing every step's top_k tips again (the paper's way; needs far more "
                             "memory at 30 steps)")
    parser.add_argument("--with-compile", action="store_true",
                        help="also time a decode step under torch.compile over transformers' StaticCache (compiles ~1 min)")
    parser.add_argument("--quick", action="store_true", help="group 4, 10 steps")
    parser.add_argument("--engines", action="store_true",
                        help="only section 6: the vLLM engine beside the default one (run with .venv-vllm's python)")
    args = parser.parse_args()
    if args.quick:
        args.group, args.steps = 4, 10
    return args


def report_rollouts(runs: dict) -> None:
    """Section 1: the rollout's generation in each cache layout, and whether the layouts play the same episodes."""
    episodes, roller, _ = runs["ragged"]
    print("\n1. rollout generation (environment steps excluded)")
    print(f"   {'':10s} {'prefilled':>10s} {'computed':>10s} {'model calls':>11s} {'cache read':>11s} "
          f"{'of it holes':>11s} {'seconds':>8s}")
    for name, (_, r, _) in runs.items():
        g = r.last_generator
        read, real = cache_positions(g)
        print(f"   {name:10s} {g.prefilled_tokens:10d} {g.computed_tokens:10d} {g.forward_calls:11d} "
              f"{read:11d} {1 - real / read:11.0%} {r.timer.generation:8.1f}")
    base = roller.timer.generation
    for name, (other, r, _) in runs.items():
        if name != "ragged":
            same = sum([t.executed_action for t in a.turns] == [t.executed_action for t in b.turns]
                       for a, b in zip(episodes, other))
            gap = max(logprob_gap(a, b) for a, b in zip(episodes, other))
            print(f"   ragged vs {name}: {r.timer.generation / base:5.2f}x faster; same episodes "
                  f"{same}/{len(episodes)}; max |log-prob difference| {gap:.3f} (bf16; compared up to the "
                  f"first different action)")



def report_decode_step(args, model, tokenizer, runs: dict, bandwidth: float) -> None:
    """Section 2: one decode step over each layout's cache against the memory-bandwidth bound, and the levers not kept."""
    print("\n2. one decode step (every row, one new token) over the rollout's cache")
    trunk_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    layers = runs["ragged"][1].last_generator.cache.layers
    position_bytes = sum(layer.key_buffer[0, :, 0].numel() * 2 * layer.key_buffer.element_size()
                         for layer in layers)  # keys and values of one position, all layers
    steps = {}
    for name in runs:
        g = runs[name][1].last_generator
        read, real = cache_positions(g)
        bound = (trunk_bytes + real * position_bytes) / (bandwidth * 1e9) * 1000  # what must be read, once
        steps[name] = ms = decode_step_ms(g)
        print(f"   {name:8s}: {ms:6.1f} ms at batch {len(g.rows)}, reading {read} cache positions ({real} real); "
              f"bound {bound:5.1f} ms (weights {trunk_bytes / 1e6:.0f} MB + real KV "
              f"{real * position_bytes / 1e6:.0f} MB); {ms / bound:4.1f}x the bound (goal: within 3x)")
    print(f"   ragged vs padded: {steps['padded'] / steps['ragged']:.2f}x faster; vs plain: "
          f"{steps['plain'] / steps['ragged']:.2f}x")
    levers = decode_levers(model, runs["padded"][1].last_generator)
    kept = levers.pop("LoRA adapter (kept)")[0]
    for name, (ms, gap) in levers.items():
        print(f"   {name}: {ms:6.1f} ms, {kept / ms:4.2f}x faster than the padded LoRA model as kept ({kept:.1f} ms); "
              f"max |log-prob difference| {gap:.3f} (tokens of probability >= 1%)")
    print("   (not kept: the update scores actions with the adapter unmerged, and merging in bf16 then unmerging"
          "\n    changes the base weights, so each iteration would need a copy of them; eager attention repeats"
          "\n    the key/value heads)")
    if args.with_compile:
        g = runs["ragged"][1].last_generator
        length = round(cache_positions(g)[1] / len(g.rows))
        lever = compiled_decode_lever(model, tokenizer, len(g.rows), length)
        kept = lever["ragged cache (kept)"]
        print(f"   torch.compile, measured on {len(g.rows)} synthetic prompts of {length} tokens (the rollout's mean):"
              f"\n     ragged cache (kept) {kept:6.1f} ms; StaticCache eager {lever['StaticCache, eager']:6.1f} ms; "
              f"StaticCache compiled {lever['StaticCache, torch.compile']:6.1f} ms "
              f"({lever['StaticCache, eager'] / lever['StaticCache, torch.compile']:.2f}x faster than eager, "
              f"{kept / lever['StaticCache, torch.compile']:.2f}x than the ragged cache) after "
              f"{lever['compile seconds']:.0f} s of compiling; max |log-prob difference| compiled vs eager "
              f"{lever['compiled log-prob gap']:.3f}")



def report_environment_and_update(args, model, envs, variation, episodes) -> None:
    """Sections 3 and 4: the group's environment steps one by one vs at once; one packed update pass."""
    print("\n3. environment steps of the group, replaying the rollout's actions")
    one_by_one = replay_seconds(envs, variation, episodes, parallel=False)
    together = replay_seconds(envs, variation, episodes, parallel=True)
    print(f"   one after the other {one_by_one:6.1f} s   at the same time {together:6.1f} s   "
          f"ratio {one_by_one / together:4.2f}x faster")

    longest = max(episodes, key=lambda e: tokens_processed(e, with_tips=False, packed=True))
    seconds, attention, backward = update_pass_split(model, longest)
    tokens = tokens_processed(longest, with_tips=False, packed=True)
    print("\n4. one packed update pass (forward + backward, tip-free) over the rollout's longest episode")
    print(f"   {tokens} tokens in {seconds:.2f} s ({tokens / seconds:.0f} tokens/s); attention (sdpa, forward + "
          f"backward) {attention:.0%} of the CPU time, its backward {backward:.1f}x its forward")

    if args.with_naive:
        print("\n4b. update log-probs: packed (one pass per episode) vs one pass per turn, forward + backward")
        model.train()
        timings = {}
        for packed in (True, False):
            tokens = sum(tokens_processed(e, with_tips=False, packed=packed) for e in episodes)
            start = time.perf_counter()
            for episode in episodes:
                episode_logprobs(model, episode, with_tips=False, packed=packed).sum().backward()
            model.zero_grad(set_to_none=True)
            timings[packed] = (tokens, time.perf_counter() - start)
        (packed_tokens, packed_s), (turn_tokens, turn_s) = timings[True], timings[False]
        print(f"   tokens {packed_tokens} vs {turn_tokens} ({turn_tokens / packed_tokens:.2f}x fewer); "
              f"seconds {packed_s:.1f} vs {turn_s:.1f} ({turn_s / packed_s:.2f}x faster)")


def report_iterations(args) -> None:
    """Section 5: whole EMPO2 and GRPO iterations through the trainer."""
    print("\n5. whole iterations through the trainer (laptop profile, p = 0.5 for EMPO2; the second iteration)")
    # The laptop profile shows each retrieved tip once per episode (repeat_tips=False).
    results = {"EMPO2": iteration(args, "empo2"), "GRPO": iteration(args, "grpo")}
    if args.with_repeated_tips:
        results["EMPO2 tips repeated"] = iteration(args, "empo2", repeat_tips=True)
    print(f"   {'':15s} {'iteration':>9s} {'rollout':>8s} {'generate':>8s} {'env':>6s} {'memory':>7s} {'update':>7s} "
          f"{'plain update':>12s} {'steps':>6s} {'tokens in context':>17s} {'of them tips':>12s}")
    for name, (m, extra) in results.items():
        tips = 1 - extra["tip-free tokens"] / extra["context tokens"]
        print(f"   {name:15s} {m['time/iteration']:9.1f} {m['time/rollout']:8.1f} {m['time/generation']:8.1f} "
              f"{m['time/environment']:6.1f} {m['time/memory']:7.1f} {m['time/update']:7.1f} "
              f"{extra['plain update seconds']:12.1f} {m['train/steps']:6.1f} {extra['context tokens']:17d} {tips:12.0%}")
    (new, extra), (grpo, grpo_extra) = results["EMPO2"], results["GRPO"]
    print(f"   EMPO2 iteration: {new['time/iteration']:.1f} s (goal: under 60 s at group 8 x 30 steps)")
    print(f"   update with θ_old from the first gradient pass vs a separate pass, same episodes: "
          f"{extra['plain update seconds'] / new['time/update']:.2f}x faster (EMPO2), "
          f"{grpo_extra['plain update seconds'] / grpo['time/update']:.2f}x (GRPO)")
    read = "update/tokens_read_per_trajectory_token"
    print(f"   update tokens read per trajectory token (goal: within 1.2x): EMPO2 {new.get(read, 0):.2f} "
          f"(plain way {extra['plain tokens read']:.2f}), GRPO {grpo.get(read, 0):.2f} "
          f"(plain way {grpo_extra['plain tokens read']:.2f}); off-policy episodes read their tips for θ_old")
    print(f"   memory operations: {new['time/memory'] / new['time/rollout']:.1%} of rollout time (goal: under 5%); "
          f"tip writing {new['time/tip_writing'] / new['time/rollout']:.1%}, embedding + retrieval + storage "
          f"{(new['time/memory'] - new['time/tip_writing']) / new['time/rollout']:.1%}")
    per_token = (new["time/iteration"] / extra["context tokens"]) / (grpo["time/iteration"] / grpo_extra["context tokens"])
    print(f"   EMPO2 / GRPO iteration time: {new['time/iteration'] / grpo['time/iteration']:.2f}x (goal: at most 1.3x); "
          f"per token in context {per_token:.2f}x")
    if args.with_repeated_tips:
        again, again_extra = results["EMPO2 tips repeated"]
        print(f"   EMPO2 showing each tip once per episode (the laptop profile) vs every step's top_k again: iteration "
              f"{new['time/iteration']:.1f} s vs {again['time/iteration']:.1f} s, "
              f"{again['time/iteration'] / new['time/iteration']:.2f}x faster; context tokens "
              f"{extra['context tokens']} vs {again_extra['context tokens']}")
    print("   (two trainers never play the same episodes: ScienceWorld lists a room's objects in an order that changes"
          "\n    between resets, so the comparisons of ways above are made on the same episodes, not across trainers)")



def main() -> None:
    args = arguments()
    threads = torch.get_num_threads()
    bandwidth = read_bandwidth_gb_s()
    print(f"0. machine: {threads} threads, memory read bandwidth {bandwidth:.1f} GB/s (sum of 512 MB)")
    print(f"   task {args.task}, group {args.group} x {args.steps} steps, {args.decoding} decoding")

    model, tokenizer = load_policy(lora_rank=8)
    envs = [env_from_config(laptop_config(args)) for _ in range(args.group)]
    try:
        variation = envs[0].train_variations[0]
        if args.engines:
            engine_comparison(args, model, tokenizer, envs, variation)
            return
        ways = {"ragged": {}, "padded": {"cache_layout": "padded"}, "plain": {"cache_layout": "plain"}}
        if args.with_naive:
            ways["re-encode"] = {"reuse_cache": False}
        runs = {name: rollout(model, tokenizer, envs, variation, args, **way) for name, way in ways.items()}
        report_rollouts(runs)
        report_decode_step(args, model, tokenizer, runs, bandwidth)
        report_environment_and_update(args, model, envs, variation, runs["ragged"][0])
    finally:
        for env in envs:
            env.close()
    del model
    report_iterations(args)

if __name__ == "__main__":
    main()
