"""A live experiment for the workshop: GRPO and EMPO² trained side by side for a few iterations, each
iteration printed as it ends.

On CoinCollector an untrained policy rarely takes the coin, so most groups of episodes tie at score 0: GRPO's
advantages are then all 0 and its update has nothing to learn from (the update is skipped). EMPO² adds a
novelty bonus to each episode's return (1/n for a state seen n times), so its groups differ even when their
scores tie, and every iteration carries a learning signal. `side_by_side` shows that as it happens:

    from empo2.analysis import live
    cfg = live.live_config("laptop", seed=0)
    rows = live.side_by_side(cfg, iterations=4)   # prints a line per method and iteration

The runs are the first iterations of the `laptop` CoinCollector runs of notebook 11 (the same config and seed
play the same episodes), trained into a temporary folder; `rows` (one per method and iteration) is what a
notebook saves and prints again (`show_row`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from pathlib import Path

import pandas as pd

from empo2.config import EMPO2Config

METHODS = ("grpo", "empo2")
LABELS = {"grpo": "GRPO", "empo2": "EMPO²"}
LIVE_ITERATIONS = {"ci": 2, "laptop": 4, "paper": 4}
"""How many iterations the live cell trains each method at each profile. At `laptop`, 4: in the committed
CoinCollector runs GRPO had a learning signal in at most 2 of its first 4 iterations in every seed, EMPO² in all 4."""


def live_config(profile: str, seed: int, results_dir: str = "results") -> EMPO2Config:
    """EMPO²'s CoinCollector config of notebook 11's runs at `profile` (GRPO's is the same with its method)."""
    return EMPO2Config.from_profile(profile, results_dir=results_dir, experiment="live", env="textworld_express",
                                    task="coin", method="empo2", seed=seed)


def side_by_side(cfg: EMPO2Config, iterations: int, *, show=print, show_progress: bool | None = None) -> list[dict]:
    """Train GRPO and EMPO² (`cfg` with each method) for `iterations` iterations, alternating: GRPO's iteration
    1, EMPO²'s iteration 1, ... Each iteration is shown (`show(show_row(row))`) as soon as it ends. Returns the
    rows: method, iteration, the group's scores and novelty bonuses, whether it carried a learning signal
    (returns that differ, so advantages that are not all 0), its training score and its seconds."""
    from tqdm.auto import tqdm

    from empo2.analysis.experiments import progress_enabled
    from empo2.method.trainer import Trainer
    from empo2.runs import read_rows

    show_progress = progress_enabled() if show_progress is None else show_progress
    rows = []
    with tempfile.TemporaryDirectory(prefix="empo2-live-") as scratch, contextlib.ExitStack() as stack:
        trainers = {method: stack.enter_context(Trainer(
            dataclasses.replace(cfg, method=method, results_dir=scratch), show_progress=False))
            for method in METHODS}
        bar = tqdm(total=iterations * len(METHODS), desc="live: GRPO and EMPO²", unit="iteration",
                   disable=not show_progress)
        for iteration in range(1, iterations + 1):
            for method, trainer in trainers.items():
                bar.set_postfix_str(f"{LABELS[method]} iteration {iteration}")
                started = time.perf_counter()
                # One iteration, without `train()`'s checkpoint and evaluation: the folder is thrown away.
                metrics = trainer.train_iteration()
                episodes = [r for r in read_rows(Path(trainer.run_dir) / "episodes.jsonl")
                            if r["phase"] == "train" and r["iteration"] == iteration]
                row = {"method": method, "iteration": iteration,
                       "scores": [r["score"] for r in episodes], "novelty": [r["intrinsic"] for r in episodes],
                       "signal": metrics["train/groups_with_signal"] > 0, "score": metrics["train/score"],
                       "seconds": round(time.perf_counter() - started, 1)}
                rows.append(row)
                bar.update(1)
                show(show_row(row))
        bar.close()
    return rows


def watch(cfg: EMPO2Config, iterations: int, path: str | Path, *, force: bool = False) -> list[dict]:
    """`side_by_side`, saved at `path` beside its config (`lessons.cached`): the same config and iterations print
    the saved rows again instead of training; another seed or `force` trains, printing as it goes."""
    from empo2.analysis.lessons import cached

    shown = []

    def train() -> list[dict]:
        return side_by_side(cfg, iterations, show=lambda line: (print(line, flush=True), shown.append(line)))

    rows = cached(path, cfg, train, force=force, settings={"iterations": iterations, "methods": list(METHODS)})
    if not shown:
        print("\n".join(show_row(row) for row in rows))
    return rows


def show_row(row: dict) -> str:
    """One line per method and iteration: the group's scores, its novelty bonuses, and whether it can learn."""
    scores = " ".join(f"{s:.0f}" for s in row["scores"])
    novelty = (f"; novelty bonus {min(row['novelty']):.2f}–{max(row['novelty']):.2f}" if any(row["novelty"]) else "")
    if row["signal"]:
        verdict = "returns differ: a learning signal"
    else:
        verdict = "returns all equal: no learning signal, update skipped"
    return (f"iteration {row['iteration']} · {LABELS[row['method']]:<5}  scores {scores}{novelty}  →  {verdict}"
            f"  ({row['seconds']:.0f} s)")


def summary(rows: list[dict]) -> pd.DataFrame:
    """Per method: iterations trained, those with a learning signal, the mean training score and the minutes."""
    frame = pd.DataFrame(rows)
    table = frame.groupby("method", sort=False).agg(
        iterations=("iteration", "size"), with_signal=("signal", "sum"), training_score=("score", "mean"),
        minutes=("seconds", lambda s: s.sum() / 60))
    return table.rename(index=LABELS, columns={"with_signal": "with a learning signal",
                                               "training_score": "training score"}).round(2)


def plays_like_runs(rows: list[dict], folders: dict[str, Path]) -> bool:
    """Whether the live rows' training scores are, episode by episode, those of the committed runs of the same
    config and seed (method -> run folder) in the same iterations: the live cell replays the start of a run."""
    from empo2.analysis.experiments import episodes

    for method, folder in folders.items():
        played = episodes(folder)
        for row in (r for r in rows if r["method"] == method):
            run = played[(played["phase"] == "train") & (played["iteration"] == row["iteration"])]
            if list(run["score"]) != row["scores"]:
                return False
    return True


def signal_in_committed_runs(folders_by_method: dict[str, list[Path]], iterations: int) -> pd.DataFrame:
    """The same count in committed runs: per method (label -> run folders, one per seed), how many of each seed's
    first `iterations` iterations carried a learning signal (an update that was not skipped)."""
    from empo2.analysis.experiments import metrics
    from empo2.analysis.lessons import skipped_updates

    counts = {}
    for label, folders in folders_by_method.items():
        for folder in folders:
            first = metrics(folder).dropna(subset=["time/iteration"]).head(iterations)
            counts.setdefault(label, {})[f"seed {first['seed'].iloc[0]}"] = int((1 - skipped_updates(first)).sum())
    return pd.DataFrame(counts).T.rename_axis(f"signal in the first {iterations}")
