"""Benchmark: what the two performance designs buy, measured in one run on real ScienceWorld.

    python -m empo2.bench [--task power-component] [--group 4] [--steps 10] [--tokens 16] [--decoding free]

Prints, for one group of episodes played greedily (so both ways play the same game):
  1. rollout with the KV cache kept across turns vs re-encoding the history every step:
     prompt tokens prefilled and seconds, and their ratios;
  2. the update's log-prob pass, packed (one forward per episode) vs per turn:
     tokens processed and seconds for forward + backward, and their ratios;
  3. a full EMPO² iteration through the trainer: its wall time and the share of
     rollout time spent in memory operations (tip generation, retrieval, storage).
Speed is reported as ratios of two ways measured in the same process, not as
absolute targets: the machines are noisy.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from empo2.config import EMPO2Config
from empo2.envs import make_env
from empo2.logprobs import episode_logprobs, tokens_processed
from empo2.loss import PLAIN
from empo2.models import load_policy
from empo2.rollout import Roller


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="power-component")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--decoding", default="free", choices=("free", "constrained"),
                        help="free text snapped to actions, or constrained action decoding")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"threads {torch.get_num_threads()}, task {args.task}, group {args.group}, "
          f"{args.steps} steps, {args.tokens} tokens per action, {args.decoding} decoding")

    model, tokenizer = load_policy(lora_rank=8)
    envs = [make_env("scienceworld", args.task, max_steps=args.steps, n_test_variations=1) for _ in range(args.group)]
    try:
        variation = envs[0].train_variations[0]
        results = {}
        for reuse in (True, False):
            roller = Roller(model, tokenizer, env_name="scienceworld", response_tokens=args.tokens, tip_tokens=8,
                            reuse_cache=reuse, action_decoding=args.decoding)
            start = time.perf_counter()
            episodes = roller.run(envs, [variation] * args.group, [PLAIN] * args.group, temperature=0.0)
            results[reuse] = (roller.last_generator.prefilled_tokens, time.perf_counter() - start,
                              roller.timer.generation, episodes)
        (cached_tokens, cached_s, cached_gen, episodes), (naive_tokens, naive_s, naive_gen, _) = results[True], results[False]
        same = [e.turns[-1].executed_action for e in episodes] == [e.turns[-1].executed_action for e in results[False][3]]
        print("\n1. rollout: KV cache kept across turns vs re-encoding the history")
        print(f"   prompt tokens prefilled  cache {cached_tokens:>8d}   re-encode {naive_tokens:>8d}   "
              f"ratio {naive_tokens / cached_tokens:5.2f}x fewer")
        print(f"   generation seconds       cache {cached_gen:8.1f}   re-encode {naive_gen:8.1f}   "
              f"ratio {naive_gen / cached_gen:5.2f}x faster")
        print(f"   rollout seconds (+env)   cache {cached_s:8.1f}   re-encode {naive_s:8.1f}   "
              f"(same final actions in both: {same})")

        print("\n2. update: packed log-probs (one pass per episode) vs one pass per turn, forward + backward")
        model.train()
        timings = {}
        for packed in (True, False):
            tokens = sum(tokens_processed(e, with_tips=False, packed=packed) for e in episodes)
            start = time.perf_counter()
            values = []
            for episode in episodes:
                logprobs = episode_logprobs(model, episode, with_tips=False, packed=packed)
                logprobs.sum().backward()
                values.append(logprobs.detach())
            model.zero_grad(set_to_none=True)
            timings[packed] = (tokens, time.perf_counter() - start, torch.cat(values))
        (packed_tokens, packed_s, packed_lp), (turn_tokens, turn_s, turn_lp) = timings[True], timings[False]
        print(f"   tokens processed         packed {packed_tokens:>7d}   per turn {turn_tokens:>8d}   "
              f"ratio {turn_tokens / packed_tokens:5.2f}x fewer")
        print(f"   seconds                  packed {packed_s:7.1f}   per turn {turn_s:8.1f}   "
              f"ratio {turn_s / packed_s:5.2f}x faster")
        print(f"   max |log-prob difference| (bf16) {float((packed_lp - turn_lp).abs().max()):.3f}")
    finally:
        for env in envs:
            env.close()
    del model

    print("\n3. one full EMPO² iteration through the trainer (p = 0.5 so memory is exercised)")
    with tempfile.TemporaryDirectory() as folder:
        cfg = EMPO2Config.from_profile(
            "laptop", task=args.task, results_dir=folder, group_size=args.group, max_steps=args.steps,
            response_tokens=args.tokens, p=0.5, iterations=2, eval_every=100, checkpoint_every=0,
            action_decoding=args.decoding, minibatch_episodes=0,
        )
        from empo2.trainer import Trainer

        with Trainer(cfg, show_progress=False) as trainer:
            trainer.train_iteration()  # the first iteration fills the memory
            metrics = trainer.train_iteration()
    rollout = metrics["time/rollout"]
    print(f"   iteration wall time {metrics['time/iteration']:.1f} s  (rollout {rollout:.1f} s, "
          f"update {metrics['time/update']:.1f} s)")
    print(f"   rollout split: generation {metrics['time/generation']:.1f} s, environment "
          f"{metrics['time/environment']:.1f} s, memory {metrics['time/memory']:.1f} s, "
          f"novelty {metrics['time/novelty']:.1f} s")
    print(f"   memory operations share of rollout time: {metrics['time/memory'] / rollout:.1%} "
          f"(memory episodes this iteration: {metrics['train/episodes/memory_on'] + metrics['train/episodes/off_policy']}"
          f" of {args.group}; memory size {metrics['memory/size']})")


if __name__ == "__main__":
    main()
