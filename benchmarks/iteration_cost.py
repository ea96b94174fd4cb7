"""Benchmark: where a `laptop` iteration's time goes, per token, held against its bound.

    python benchmarks/iteration_cost.py [--env textworld_express] [--task coin] [--iterations 3] [--eval-games 16]
                                        [--methods empo2 grpo]

Prints, for the laptop model (SmolLM2-135M, LoRA r8) on this machine's cores:
  0. the machine: torch threads; the matrix throughput of the policy's own shapes (its linear layers over a
     1,300-token pass, in the policy's dtype) and the memory read bandwidth (a sum over 512 MB);
  1. per method, `--iterations` laptop iterations through the trainer (one training game, so that EMPO²'s second
     iteration retrieves the first's tips; the first iteration warms up and is not counted), then one evaluation
     of `--eval-games` held-out games: per part, its seconds, the tokens it ran through the model, and its bound:
       generation (actions and tips)  every forward call of the sampler, each at the larger of its FLOPs at the
                                      measured throughput and the bytes it must read (the weights and the rows'
                                      KV entries) at the measured bandwidth;
       update                         the tokens its passes read with a gradient (forward and LoRA backward: twice a
                                      forward's linear FLOPs, and attention's backward 2.5 times its forward) and
                                      without (θ_old's passes: a forward), at the measured throughput;
       evaluation                     as generation;
       environment, memory            measured only (no model work but the embedder's, a 22M-parameter encoder);
     the training episodes per CPU-hour (this machine's cores); and the ceiling of one exact lever not built: the token reads an update would save if a group's shared
     beginning (the longest first tokens all its updated episodes share) were computed once per group.

FLOPs per token of a pass over a sequence of L tokens: 2 × (the trunk's linear weights) plus attention,
4 × (hidden size) × (the position) per layer, causal; the LM head only at scored positions. The bound says how far
each part is from what the hardware could do with the same tokens; the levers that change the tokens are measured
in docs/performance.md.
With --levers, first two levers measured and not kept: the attention kernels torch offers on a CPU for a training
pass, and θ_old's passes over a mini-batch's episodes as one padded batch.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict

import numpy as np
import torch

from bench import read_bandwidth_gb_s  # benchmarks/bench.py, beside this file
from empo2.config import EMPO2Config
from empo2.llm.generation import GroupGenerator
from empo2.llm.logprobs import forward_passes
from empo2.llm.models import load_policy
from empo2.method.trainer import Trainer


class Shape:
    """The policy's sizes that its FLOPs and bytes depend on."""

    def __init__(self, model):
        config = model.config
        self.layers = config.num_hidden_layers
        self.hidden = config.hidden_size
        self.kv_width = config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
        self.vocab = config.vocab_size
        self.linear = sum(p.numel() for n, p in model.named_parameters() if "layers." in n and p.dim() == 2
                          and "lora_" not in n)
        """Weights of the trunk's linear layers (LoRA adapters aside)."""
        self.weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lora_" not in n)

    def forward_flops(self, new: int, past: int) -> float:
        """A forward pass of `new` tokens after `past` cached ones: linear layers and causal attention."""
        attention = 4 * self.hidden * self.layers * (new * past + new * (new + 1) / 2)
        return 2 * self.linear * new + attention

    def attention_flops(self, new: int, past: int) -> float:
        return 4 * self.hidden * self.layers * (new * past + new * (new + 1) / 2)

    def kv_bytes(self, positions: int, element: int = 2) -> float:
        """The KV entries of `positions` cached tokens, every layer."""
        return 2 * self.kv_width * self.layers * positions * element


def matrix_throughput(model, tokens: int = 1300, repeats: int = 3) -> float:
    """FLOP/s of the trunk's linear layers over `tokens` tokens in the policy's dtype (best of `repeats`)."""
    dtype = next(model.parameters()).dtype
    weights = [p.detach() for n, p in model.named_parameters() if "layers." in n and p.dim() == 2 and "lora_" not in n]
    flops = sum(2 * tokens * w.numel() for w in weights)
    inputs = {w.shape[1]: torch.randn(tokens, w.shape[1], dtype=dtype) for w in weights}
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            for w in weights:
                inputs[w.shape[1]] @ w.T
            best = min(best, time.perf_counter() - start)
    return flops / best


class SamplerCounts:
    """Every forward call of every GroupGenerator while installed: the tokens it ran, the cached positions its
    rows attended to, and so its FLOPs and bytes (a wrapper around `GroupGenerator._feed`)."""

    def __init__(self, shape: Shape):
        self.shape = shape
        self.calls, self.tokens, self.flops, self.bytes = 0, 0, 0.0, 0.0
        self._original = GroupGenerator._feed

    def __enter__(self):
        counts = self

        def feed(generator, chunks):
            for slot, chunk in chunks.items():
                past = len(generator.fed[slot])
                counts.tokens += len(chunk)
                counts.flops += counts.shape.forward_flops(len(chunk), past) + 2 * counts.shape.hidden * counts.shape.vocab
                counts.bytes += counts.shape.kv_bytes(past + len(chunk))
            counts.bytes += counts.shape.weight_bytes
            counts.calls += 1
            return counts._original(generator, chunks)

        GroupGenerator._feed = feed
        return self

    def __exit__(self, *exc):
        GroupGenerator._feed = self._original

    def bound_seconds(self, throughput: float, bandwidth: float) -> float:
        """A lower bound: all FLOPs at the throughput or all bytes at the bandwidth, whichever is longer."""
        return max(self.flops / throughput, self.bytes / bandwidth)


def update_flops(shape: Shape, episodes, with_gradient: float, without: float) -> float:
    """FLOPs of the update's passes: each episode's tokens read with a gradient (a forward, the input gradients of
    every linear layer: as much again, attention's backward: 2.5 times its forward) and without (a forward)."""
    lengths = [len(e.turns[-1].prompt_ids_tip_free) + len(e.turns[-1].response_ids) for e in episodes if e.turns]
    mean_length = float(np.mean(lengths)) if lengths else 0.0
    per_token = shape.forward_flops(mean_length, 0) / max(mean_length, 1)
    attention = shape.attention_flops(mean_length, 0) / max(mean_length, 1)
    return with_gradient * (2 * per_token + 2.5 * attention) + without * per_token


def shared_beginning(episodes, advantages, packed: bool) -> float:
    """The ceiling of a lever not built: the tokens an epoch of the update would not read if the longest beginning
    that all of a group's updated episodes share (in the contexts they are trained in) were computed once for the
    group instead of once per episode: (updated episodes − 1) × that beginning's length. A ceiling, since the update
    can share only within a mini-batch, and the episodes' attention over the shared tokens remains."""
    if advantages is None:
        return 0.0
    passes = [forward_passes(e, with_tips=e.trained_with_tips, packed=packed)[0][0]
              for e, a in zip(episodes, advantages.tolist()) if e is not None and a != 0 and e.turns]
    if len(passes) < 2:
        return 0.0
    length = 0
    while all(len(ids) > length for ids in passes) and len({ids[length] for ids in passes}) == 1:
        length += 1
    return float((len(passes) - 1) * length)


def measure(args, method: str, shape: Shape, throughput: float, bandwidth: float) -> dict:
    """The iterations and the evaluation of one method, with their counts and bounds."""
    parts = defaultdict(float)
    with tempfile.TemporaryDirectory() as folder:
        cfg = EMPO2Config.from_profile("laptop", env=args.env, task=args.task, method=method, results_dir=folder,
                                       n_train_variations=1, n_test_variations=args.eval_games,
                                       iterations=args.iterations, eval_every=10**6, checkpoint_every=0)
        with Trainer(cfg, show_progress=False) as trainer:
            trainer.train_iteration()  # warm-up: memory filled, kernels and JIT of the JVM warm
            played = []
            for _ in range(args.iterations - 1):
                captured = {}
                update = trainer.update

                def keep(episodes, advantages, decisions=None, update=update, captured=captured):
                    captured["episodes"], captured["advantages"] = episodes, advantages
                    return update(episodes, advantages, decisions)

                trainer.update = keep
                with SamplerCounts(shape) as sampled:
                    metrics = trainer.train_iteration()
                trainer.update = update
                episodes = captured.get("episodes", [])
                played.append(len(episodes) or cfg.group_size)
                for key in ("time/generation", "time/environment", "time/memory", "time/tip_writing", "time/update",
                            "time/iteration", "tokens/context"):
                    parts[key] += metrics.get(key, 0.0)
                parts["generation bound"] += sampled.bound_seconds(throughput, bandwidth)
                parts["generation tokens"] += sampled.tokens
                parts["generation calls"] += sampled.calls
                with_gradient = metrics.get("update/tokens_read_with_gradient", 0.0)
                without = metrics.get("update/tokens_read_without_gradient", 0.0)
                parts["update tokens"] += with_gradient + without
                parts["update bound"] += update_flops(shape, episodes, with_gradient, without) / throughput
                parts["updates skipped"] += metrics.get("update/skipped", 0.0)
                parts["shared beginning"] += cfg.ppo_epochs * shared_beginning(
                    episodes, captured.get("advantages"), cfg.packed_logprobs)
            with SamplerCounts(shape) as sampled:
                evaluation = trainer.evaluate()
            parts["evaluation"] = evaluation["time/evaluation"]
            parts["evaluation bound"] = sampled.bound_seconds(throughput, bandwidth)
            parts["evaluation tokens"] = sampled.tokens
            parts["episodes"] = float(sum(played))
    counted = args.iterations - 1
    return {**{key: value / counted if not key.startswith("evaluation") and key != "episodes" else value
               for key, value in parts.items()}, "counted": counted}


def attention_kernels(length: int = 1300, repeats: int = 5) -> None:
    """A lever measured and not kept: the policy's causal attention over one episode of `length` tokens (9 query
    heads, 3 key/value heads of 64), forward and backward, in each kernel torch offers on a CPU (medians)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def timed(way):
        forward, backward = [], []
        for _ in range(repeats):
            q = torch.randn(1, 9, length, 64, dtype=torch.bfloat16, requires_grad=True)
            k, v = (torch.randn(1, 3, length, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
            start = time.perf_counter()
            out = way(q, k, v)
            middle = time.perf_counter()
            out.backward(torch.ones_like(out))
            forward.append(middle - start)
            backward.append(time.perf_counter() - middle)
        return 1000 * float(np.median(forward)), 1000 * float(np.median(backward))

    def math(q, k, v):
        with sdpa_kernel([SDPBackend.MATH]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    ways = {"flash, bf16 (today)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                   enable_gqa=True),
            "flash, key/value heads repeated": lambda q, k, v: F.scaled_dot_product_attention(
                q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True),
            "flash, float32": lambda q, k, v: F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True).bfloat16(),
            "math, bf16": math}
    print(f"\nattention of one layer over {length} tokens, forward + backward (ms):")
    base = None
    for name, way in ways.items():
        forward, backward = timed(way)
        base = base or forward + backward
        print(f"  {name:34s} {forward:6.1f} + {backward:6.1f}   {base / (forward + backward):.2f}x today's")


def batched_passes(model, lengths=(1100, 1150, 1050, 1200)) -> None:
    """A lever measured and not kept: θ_old's no-grad passes over four episodes, one at a time (today) or as one
    right-padded batch (the padding mask takes attention off the flash kernel)."""
    from empo2.llm.generation import trunk_and_head

    trunk, _ = trunk_and_head(model)
    rng = torch.Generator().manual_seed(0)
    sequences = [torch.randint(100, 40000, (n,), generator=rng) for n in lengths]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)  # (episodes, longest)
    mask = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)], mask[row, : len(sequence)] = sequence, 1
    ways = {"one at a time": lambda: [trunk(input_ids=s[None]) for s in sequences],
            "one padded batch": lambda: trunk(input_ids=ids, attention_mask=mask)}
    seconds = {name: [] for name in ways}
    with torch.no_grad():
        for _ in range(3):
            for name, way in ways.items():
                start = time.perf_counter()
                way()
                seconds[name].append(time.perf_counter() - start)
    best = {name: min(times) for name, times in seconds.items()}
    print(f"\nθ_old's passes over {len(lengths)} episodes of {min(lengths)}-{max(lengths)} tokens: one at a time "
          f"{best['one at a time']:.2f} s, one padded batch {best['one padded batch']:.2f} s "
          f"({best['one at a time'] / best['one padded batch']:.2f}x)")


def report(method: str, m: dict, eval_games: int) -> None:
    print(f"\n{method}: per iteration (mean of {m['counted']:.0f} after the warm-up), {m['tokens/context']:.0f} tokens in "
          f"context, {m['updates skipped']:.2f} of updates skipped")
    rows = [("generation (actions and tips)", m["time/generation"] + m["time/tip_writing"], m["generation tokens"],
             m["generation bound"]),
            ("update", m["time/update"], m["update tokens"], m["update bound"]),
            ("environment", m["time/environment"], 0, None),
            ("memory (embedding, retrieval, storage)", m["time/memory"] - m["time/tip_writing"], 0, None)]
    print(f"  {'part':40s} {'seconds':>8s} {'tokens':>8s} {'s/1k tok':>9s} {'bound s':>8s} {'x bound':>8s}")
    for name, seconds, tokens, bound in rows:
        per = f"{1000 * seconds / tokens:9.2f}" if tokens else f"{'—':>9s}"
        against = f"{bound:8.2f} {seconds / bound:8.1f}" if bound else f"{'—':>8s} {'—':>8s}"
        print(f"  {name:40s} {seconds:8.2f} {tokens:8.0f} {per} {against}")
    print(f"  {'iteration':40s} {m['time/iteration']:8.2f}")
    if m["update tokens"]:
        share = m["shared beginning"] / m["update tokens"]
        print(f"  a group's shared beginning computed once (not built): at most {m['shared beginning']:.0f} of the "
              f"update's {m['update tokens']:.0f} token reads ({100 * share:.0f}%), at most {share * m['time/update']:.1f} s")
    print(f"  evaluation of {eval_games} games: {m['evaluation']:.1f} s, {m['evaluation tokens']:.0f} tokens, bound "
          f"{m['evaluation bound']:.1f} s ({m['evaluation'] / m['evaluation bound']:.1f}x)")
    episodes = m["episodes"] / m["counted"]
    print(f"  training episodes an hour (evaluations aside): {3600 * episodes / m['time/iteration']:.0f} on this machine's "
          f"{torch.get_num_threads()} threads, {3600 * episodes / m['time/iteration'] / torch.get_num_threads():.0f} "
          "per core-hour")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="textworld_express")
    parser.add_argument("--task", default="coin")
    parser.add_argument("--iterations", type=int, default=3, help="the first is a warm-up")
    parser.add_argument("--eval-games", type=int, default=16)
    parser.add_argument("--methods", nargs="+", default=["empo2", "grpo"])
    parser.add_argument("--levers", action="store_true",
                        help="also the levers measured and not kept: attention kernels, θ_old's passes batched")
    args = parser.parse_args()
    model, _ = load_policy("smollm2-135m", lora_rank=8)
    shape = Shape(model)
    throughput = matrix_throughput(model)
    bandwidth = read_bandwidth_gb_s() * 1e9
    if args.levers:
        attention_kernels()
        batched_passes(model)
    del model
    print(f"machine: {torch.get_num_threads()} torch threads; linear layers of the policy "
          f"({shape.linear / 1e6:.0f}M weights) at {throughput / 1e9:.0f} GFLOP/s over 1,300 tokens; "
          f"memory read bandwidth {bandwidth / 1e9:.1f} GB/s")
    for method in args.methods:
        report(method, measure(args, method, shape, throughput, bandwidth), args.eval_games)



if __name__ == "__main__":
    main()
