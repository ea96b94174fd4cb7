"""Peak memory of one training iteration with glibc's allocator against jemalloc, and whether the numbers agree.

    python benchmarks/allocator_memory.py [--profile laptop] [--method grpo] [--iterations 1]

Trains the same run twice in fresh folders, one process after the other (`python -m empo2 train`, one torch
thread): once as Python starts, once with jemalloc preloaded (`LD_PRELOAD`). Prints each process's peak
resident memory, the ratio, and whether every metric but the clock readings is equal. The ScienceWorld
simulators run in their own JVMs and are not counted. jemalloc: `apt-get install libjemalloc2` (Debian,
Ubuntu) or `brew install jemalloc`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")


def train(preload: str | None, args, folder: Path) -> tuple[float, list[dict]]:
    """Peak resident memory (GB) of one training process, and its metrics rows."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"LD_PRELOAD": preload} if preload else {})}
    command = [sys.executable, "-m", "empo2", "train", "--profile", args.profile, "--method", args.method,
               "--task", "power-component", "--quiet", "--set", f"iterations={args.iterations}",
               "--set", f"eval_every={args.iterations + 1}", "--set", f"results_dir={folder}"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if status:
        raise SystemExit(f"{' '.join(command)} failed (status {status})")
    rows = [json.loads(line) for path in folder.rglob("metrics.jsonl") for line in path.read_text().splitlines()]
    return usage.ru_maxrss / 1e6, rows  # ru_maxrss is in kB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="laptop", choices=("ci", "laptop"))
    parser.add_argument("--method", default="grpo", choices=("grpo", "empo2"))
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--jemalloc", default=str(JEMALLOC), help="path of libjemalloc.so.2")
    args = parser.parse_args()
    if not Path(args.jemalloc).exists():
        raise SystemExit(f"--jemalloc: {args.jemalloc} not found; install libjemalloc2 or give its path")
    with tempfile.TemporaryDirectory() as scratch:
        glibc, glibc_rows = train(None, args, Path(scratch) / "glibc")
        jemalloc, jemalloc_rows = train(args.jemalloc, args, Path(scratch) / "jemalloc")
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    print(f"{args.profile} {args.method}, {args.iterations} iteration(s), peak resident memory of the training process:")
    print(f"  glibc    {glibc:6.2f} GB")
    print(f"  jemalloc {jemalloc:6.2f} GB   ratio glibc / jemalloc {glibc / jemalloc:.2f}x")
    print(f"  metrics other than times equal: {strip(glibc_rows) == strip(jemalloc_rows)} ({len(glibc_rows)} rows)")


if __name__ == "__main__":
    main()
