"""Benchmark: the two-level (seeds, then episodes) bootstrap drawn all at once vs one round at a time.

    python benchmarks/bootstrap.py [--seeds 3] [--episodes 40] [--resamples 10000]

Every interval the notebooks, the claims table and docs/results.md print over several runs is this bootstrap
(10,000 rounds), a few hundred of them per `make run`. Times one difference of two methods' means both ways
on random scores and prints the ratio, the two intervals (the same up to Monte Carlo error: they are
different draws) and the peak memory of each (rounds are drawn in batches of `stats.DRAWS_AT_ONCE` episodes).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from empo2.stats import seed_bootstrap_difference


def one_round_at_a_time(a: list[np.ndarray], b: list[np.ndarray], resamples: int, seed: int = 0
                        ) -> tuple[float, float]:
    """The textbook loop: per round, seeds drawn, then each chosen seed's episodes, for A and then for B."""
    rng = np.random.default_rng(seed)

    def draw(groups):
        chosen = rng.integers(0, len(groups), size=len(groups))
        return np.mean([groups[c][rng.integers(0, len(groups[c]), size=len(groups[c]))].mean() for c in chosen])

    differences = np.array([draw(a) - draw(b) for _ in range(resamples)])  # (resamples,)
    return float(np.quantile(differences, 0.025)), float(np.quantile(differences, 0.975))


def measured(work):
    """`work()`'s result, its seconds, and the most memory it held at once (bytes, as tracemalloc sees numpy;
    from a second run, since tracing slows many small allocations)."""
    start = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - start
    tracemalloc.start()
    work()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=40, help="test episodes per seed")
    parser.add_argument("--resamples", type=int, default=10_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    a = [rng.normal(8, 30, args.episodes) for _ in range(args.seeds)]
    b = [rng.normal(5, 30, args.episodes) for _ in range(args.seeds)]
    (_, low, high), at_once, at_once_bytes = measured(lambda: seed_bootstrap_difference(a, b, resamples=args.resamples))
    (loop_low, loop_high), loop, loop_bytes = measured(lambda: one_round_at_a_time(a, b, args.resamples))
    print(f"{args.seeds} seeds x {args.episodes} episodes per method, {args.resamples} rounds")
    print(f"all at once        {at_once:7.3f} s  {at_once_bytes / 2**20:6.1f} MiB at most   "
          f"interval [{low:+.2f}, {high:+.2f}]")
    print(f"one round at a time{loop:7.3f} s  {loop_bytes / 2**20:6.1f} MiB at most   "
          f"interval [{loop_low:+.2f}, {loop_high:+.2f}]")
    print(f"one round at a time / all at once = {loop / at_once:.0f}x the time")


if __name__ == "__main__":
    main()
