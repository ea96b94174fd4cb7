"""Does this code still produce a saved run? Retrain its first iterations and compare the episodes.

A committed run stays valid across later commits only if they do not change what it computes: the same
config and seeds must play the same episodes. `replay` trains a saved run's config again, in a scratch
folder, for its first `iterations` iterations (a `naive` run: its one evaluation), and compares every
episode row it writes with the saved one, field by field:

    python -m empo2 replay results/laptop/coin/empo2-coin-seed0 --iterations 2
    -> results/laptop/coin/empo2-coin-seed0: the first 2 iteration(s) replay identically (16 episodes)

Fields that only one side has (rows saved before a field existed) are listed, not compared.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from empo2.config import EMPO2Config
from empo2.runs import read_rows


@dataclass
class Replay:
    """What `replay` found: the rows compared, the first difference (None: identical) and the fields only
    one side has."""

    run_dir: Path
    iterations: int
    compared: int
    difference: str | None
    unshared_fields: list[str]

    def __str__(self) -> str:
        what = "its evaluation" if self.iterations == 0 else f"the first {self.iterations} iteration(s)"
        verdict = "replay identically" if self.difference is None else f"differ: {self.difference}"
        fields = f"; not compared (only one side has them): {', '.join(self.unshared_fields)}" \
            if self.unshared_fields else ""
        return f"{self.run_dir}: {what} {verdict} ({self.compared} episodes){fields}"


def first_difference(saved: list[dict], replayed: list[dict]) -> tuple[str | None, list[str]]:
    """Where two lists of episode rows differ (None if they agree on every field both have): the first row
    and field that differ, and how many rows differ in each field; and the fields only one side has."""
    saved_keys, replayed_keys = ({key for row in rows for key in row} for rows in (saved, replayed))
    unshared = sorted(saved_keys ^ replayed_keys)
    if len(saved) != len(replayed):
        return f"{len(saved)} saved episodes, {len(replayed)} replayed", unshared
    shared = sorted(saved_keys & replayed_keys)
    differing = {}  # field -> rows that differ in it
    first = None
    for index, (old, new) in enumerate(zip(saved, replayed)):
        for key in shared:
            if old.get(key) != new.get(key):
                differing[key] = differing.get(key, 0) + 1
                if first is None:
                    where = f"episode {index} (iteration {old.get('iteration')}, {old.get('phase')})"
                    first = f"{where}, field {key!r}: saved {old.get(key)!r}, replayed {new.get(key)!r}"
    if first is None:
        return None, unshared
    counts = ", ".join(f"{key} in {n}" for key, n in differing.items())
    return f"{first}; episodes that differ, by field: {counts}", unshared


def replay(run_dir: str | Path, iterations: int = 1, scratch: str | Path | None = None) -> Replay:
    """Train the config saved in `run_dir` for its first `iterations` iterations into `scratch` (a temporary
    folder if None) and compare its episodes with the saved ones of those iterations."""
    from empo2.method.trainer import Trainer

    run_dir = Path(run_dir)
    saved_config = run_dir / "config.json"
    if not saved_config.is_file():
        raise FileNotFoundError(f"run_dir: {run_dir} holds no config.json (not a run folder)")
    cfg = EMPO2Config.from_dict(json.loads(saved_config.read_text())["config"])
    if cfg.method == "naive":
        iterations = 0
    elif not 1 <= iterations <= cfg.iterations:
        raise ValueError(f"iterations: {iterations} is not between 1 and the run's {cfg.iterations}")
    saved = [row for row in read_rows(run_dir / "episodes.jsonl") if row["iteration"] <= iterations]
    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        # The run's own results_dir stays, so that init_weights resolves as it did; the records go to `folder`.
        with Trainer(cfg, folder=Path(folder) / "replay", show_progress=False) as trainer:
            trainer.train(stop_after=iterations)
        replayed = [row for row in read_rows(Path(folder) / "replay" / "episodes.jsonl")
                    if row["iteration"] <= iterations]
    difference, unshared = first_difference(saved, replayed)
    return Replay(run_dir, iterations, len(saved), difference, unshared)
