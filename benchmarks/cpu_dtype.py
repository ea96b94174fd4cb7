"""Benchmark: the policy's matrix products in bfloat16 vs float32 on this CPU, and the dtype empo2 picks here.

    python benchmarks/cpu_dtype.py [--tokens 64] [--new-tokens 8] [--threads 1]

Times, for the real SmolLM2-135M policy with the laptop profile's LoRA adapter, the two things training does
most: a forward and backward pass over `--tokens` tokens (the update) and greedy generation of `--new-tokens`
tokens (the rollouts), once in each dtype (after one warm-up), and prints seconds and the bfloat16 / float32
ratio. On CPUs with AMX or AVX512-bf16 bfloat16 is faster; on the others (AVX2 only, most laptops) it is
emulated and many times slower, so `empo2.llm.models.default_dtype` takes float32 there.
"""

from __future__ import annotations

import argparse
import time

import torch

from empo2.llm.models import default_dtype, load_policy


def _seconds(work) -> float:
    work()  # warm-up: kernels chosen, buffers allocated
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64, help="tokens in the forward and backward pass")
    parser.add_argument("--new-tokens", type=int, default=8, help="tokens generated greedily")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the laptop runs use 1 per process)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    capability = torch.backends.cpu.get_cpu_capability()
    print(f"CPU capability {capability}; empo2 picks {default_dtype()} here")
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        model, tokenizer = load_policy(lora_rank=8, lora_alpha=16, dtype=dtype)
        ids = torch.randint(100, tokenizer.vocab_size - 100, (1, args.tokens))  # (1, tokens)

        def update():
            model.zero_grad()
            model(ids, labels=ids).loss.backward()

        def rollout():
            with torch.no_grad():
                model.generate(ids[:, :16], max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                               do_sample=False, pad_token_id=tokenizer.pad_token_id)

        times[dtype] = {"update": _seconds(update), "rollout": _seconds(rollout)}
        print(f"{str(dtype):15} forward+backward of {args.tokens} tokens {times[dtype]['update']:7.2f} s, "
              f"generating {args.new_tokens} tokens {times[dtype]['rollout']:7.2f} s")
    for part in ("update", "rollout"):
        print(f"{part}: bfloat16 / float32 = {times[torch.bfloat16][part] / times[torch.float32][part]:.1f}x the time")


if __name__ == "__main__":
    main()
