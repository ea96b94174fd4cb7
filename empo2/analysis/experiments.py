"""Running experiments from notebooks: run-or-reuse, reading results, plotting helpers.

Notebooks call `run(cfg)`: if `cfg.run_dir` (`results/<profile>/<experiment>/<run>/`, the folder
`python -m empo2 train` writes too) already holds a
finished run with exactly this config, it is reused (so a fresh clone
regenerates every figure from the committed results in seconds); otherwise the
run is trained, resuming from its last checkpoint if one exists. `force=True`
retrains from scratch; a folder holding a run of another config is refused, never deleted. Figures are drawn from the files only.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
from pathlib import Path

import numpy as np
import pandas as pd

from empo2.config import EMPO2Config
from empo2.episode import MODE_NAMES, PLAIN, failed, succeeded
from empo2.runs import RunFolder, config_differences, read_rows



def holds(folder: Path, cfg: EMPO2Config) -> bool:
    """`folder` holds a finished run (or evaluation) of exactly this config."""
    record = Path(folder) / "config.json"
    if not RunFolder(folder, writes=False).finished or not record.exists():
        return False
    return not config_differences(json.loads(record.read_text())["config"], cfg)


def is_finished(cfg: EMPO2Config) -> bool:
    """A finished run of exactly this config is in `cfg.run_dir`."""
    return holds(cfg.run_dir, cfg)


PROGRESS_VARIABLE = "EMPO2_PROGRESS"
"""Set to 0 to switch progress bars off (the notebook runner does, so executed copies hold none)."""


def progress_enabled() -> bool:
    """Whether progress bars are shown: yes unless the environment variable EMPO2_PROGRESS is 0."""
    return os.environ.get(PROGRESS_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def run(cfg: EMPO2Config, *, force: bool = False, show_progress: bool | None = None) -> Path:
    """Train/evaluate `cfg` unless an identical finished run exists; return its folder.

    Progress bars show unless `show_progress` is False (None: `progress_enabled()`).

    One process at a time trains a run: another asking for it (a second notebook
    tab, the runner beside an open notebook) says which process holds it, waits,
    and then reuses what that process finished.
    """
    folder = cfg.run_dir
    with run_lock(folder):
        if not force and is_finished(cfg):
            record = json.loads((folder / "config.json").read_text())
            made_by = f"commit {record.get('git_commit', '?')[:10]}" + (
                ", uncommitted changes" if record.get("git_dirty") else "")
            print(f"reusing {folder} (finished run with the same config, made by {made_by}; force=True retrains)")
            return folder
        from empo2.method.trainer import Trainer

        if show_progress is None:
            show_progress = progress_enabled()
        # An unfinished run of this config resumes; one of another config is refused (RunExists), not deleted.
        with Trainer(cfg, resume=True, overwrite=force, show_progress=show_progress) as trainer:
            trainer.train()
    return folder


def saved_retest(cfg: EMPO2Config) -> Path | None:
    """The latest finished evaluation of exactly `cfg` among its run's `evaluations/eval-NNN/`, if any."""
    evaluations = sorted((cfg.run_dir / "evaluations").glob("eval-[0-9][0-9][0-9]"), reverse=True)
    return next((folder for folder in evaluations if holds(folder, cfg)), None)


def retest(cfg: EMPO2Config, *, force: bool = False, show_progress: bool | None = None) -> Path:
    """Evaluate the trained run in `cfg.run_dir` again under `cfg` (e.g. on more test games than its own
    evaluations played), into the run's `evaluations/eval-NNN/` (`trainer.evaluate_run`); return that folder.

    A saved evaluation of exactly this config (`saved_retest`) is reused unless `force`. The run's records are
    only read. Its weights are its last checkpoint or final_weights.pt, which git does not keep: on a clone,
    only saved evaluations can be read.
    """
    with run_lock(cfg.run_dir):
        saved = None if force else saved_retest(cfg)
        if saved is not None:
            print(f"reusing {saved} (finished evaluation with the same config; force=True evaluates again)")
            return saved
        from empo2.method.trainer import evaluate_run

        _, folder = evaluate_run(cfg, show_progress=progress_enabled() if show_progress is None else show_progress)
    return Path(folder)


@contextlib.contextmanager
def run_lock(folder: Path):
    """Hold `folder`'s run for this process: a lock file beside it (`filelock`, on every platform) and, while held,
    a note of the holder that a waiting process prints. Released with the block or the process."""
    from filelock import FileLock, Timeout

    folder.parent.mkdir(parents=True, exist_ok=True)
    lock, holder = FileLock(folder.parent / f".{folder.name}.lock"), folder.parent / f".{folder.name}.holder"
    try:
        lock.acquire(timeout=0)
    except Timeout:
        held_by = holder.read_text().strip() if holder.exists() else ""
        print(f"{folder} is being trained by {held_by or 'another process'}; waiting for it ...", flush=True)
        lock.acquire()
    try:
        holder.write_text(f"process {os.getpid()} on {platform.node()}")
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()


@contextlib.contextmanager
def lane_claim(folder: Path):
    """Claim `folder`'s run for one of several processes (lanes) working through the same list of runs: yields True
    while this process holds the claim, or False at once when another lane does, so that this one moves on to the
    next run instead of waiting (`run_lock` waits). The claim ends with the block or the process."""
    from filelock import FileLock, Timeout

    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(folder.parent / f".{folder.name}.lane.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


def read_jsonl(path: Path) -> pd.DataFrame:
    return pd.DataFrame(read_rows(path))


def metrics(folder: Path) -> pd.DataFrame:
    """One row per iteration; `run`, `method` and `seed` columns added for grouping."""
    frame = read_jsonl(Path(folder) / "metrics.jsonl")
    config = json.loads((Path(folder) / "config.json").read_text())["config"]
    return frame.assign(run=Path(folder).name, method=config["method"], seed=config["seed"])


def run_minutes(folder: Path) -> float:
    """A run's wall-clock as it recorded it: its iterations' and evaluations' seconds, summed, in minutes."""
    rows = read_jsonl(Path(folder) / "metrics.jsonl")
    return sum(rows[c].fillna(0).sum() for c in ("time/iteration", "time/evaluation") if c in rows) / 60


def episodes(folder: Path) -> pd.DataFrame:
    frame = read_jsonl(Path(folder) / "episodes.jsonl")
    config = json.loads((Path(folder) / "config.json").read_text())["config"]
    return frame.assign(run=Path(folder).name, method=config["method"], seed=config["seed"])


def training_episodes(folder: Path) -> pd.DataFrame:
    """The rows of a run's training episodes (its tests left out)."""
    frame = episodes(folder)
    return frame[frame["phase"] == "train"]


def tip_free_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of episodes played without tips (GRPO's all, EMPO²'s plain ones; every test episode)."""
    return frame[frame["mode"] == PLAIN.label]


def tip_free_training_scores(folder: Path, iterations: range | None = None) -> np.ndarray:
    """Scores of a run's training episodes played without tips (GRPO's all, EMPO²'s plain ones), of every
    iteration or of `iterations`: (episodes,). Their mean is the area under the tip-free policy's learning
    curve."""
    train = tip_free_rows(training_episodes(folder))
    if iterations is not None:
        train = train[train["iteration"].isin(iterations)]
    return train["score"].to_numpy(dtype=float)


def fatal_endings_by_half(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """Whether each training episode ended at −100 (1.0) or not (0.0), in the first and in the second half of
    the run's iterations: (episodes in the first half,), (episodes in the second half,)."""
    train = training_episodes(folder)
    half = train["iteration"].max() / 2
    ended = failed(train["score"].to_numpy(float)).astype(float)
    return ended[(train["iteration"] <= half).to_numpy()], ended[(train["iteration"] > half).to_numpy()]


def final_test_scores(folder: Path) -> np.ndarray:
    """Scores of the test episodes of a run's last evaluation: (episodes,)."""
    frame = episodes(folder)
    tested = frame[frame["phase"] == "eval"] if len(frame) else frame
    if tested.empty:
        return np.zeros(0)
    return tested[tested["iteration"] == tested["iteration"].max()]["score"].to_numpy(dtype=float)


def score_table(folders: list[Path]) -> pd.DataFrame:
    """Per method: mean final test score over seeds with its 95% interval (a t-interval over the seeds' means;
    over the test episodes for one seed), success rate, seeds, test and training episodes, training time per run."""
    from empo2.stats import seed_interval

    by_method: dict[str, list[Path]] = {}
    for folder in folders:
        by_method.setdefault(metrics(folder)["method"].iloc[0], []).append(Path(folder))
    rows = []
    for method, chosen in by_method.items():
        scores = [final_test_scores(f) for f in chosen]
        mean, low, high = seed_interval(scores)
        frames = [metrics(f) for f in chosen]
        train = [episodes(f) for f in chosen]
        rows.append({
            "method": method, "score": mean, "95% low": low, "95% high": high,
            "success": float(np.mean(succeeded(np.concatenate(scores)))), "seeds": len(chosen),
            "test episodes": int(sum(len(s) for s in scores)),
            "training episodes per run": int(np.mean([(t["phase"] == "train").sum() for t in train])),
            "training minutes per run": float(np.mean([f["time/iteration"].sum() / 60 if "time/iteration" in f else 0.0
                                                       for f in frames])),
        })
    return pd.DataFrame(rows).set_index("method")


def compare_methods(folders_a: list[Path], folders_b: list[Path]) -> dict:
    """Difference of mean final test score, A minus B (runs of A and of B, one per seed), with its 95%
    interval (`stats.seed_difference`), the permutation p over seeds and the verdict (`stats.verdict`,
    neutrally worded: "above 0 outside the noise" is A above B)."""
    from empo2.stats import permutation_p, seed_difference, verdict

    scores_a, scores_b = [final_test_scores(f) for f in folders_a], [final_test_scores(f) for f in folders_b]
    difference, low, high = seed_difference(scores_a, scores_b)
    p = permutation_p(scores_a, scores_b)
    return {"difference": difference, "95% low": low, "95% high": high, "p": p,
            "verdict": verdict(low, high, p, claim=False)}


def policy_comparison(folders: dict[str, list[Path]], baseline: str) -> pd.DataFrame:
    """Per policy (label -> its runs, one per seed): mean final test score and the share of test episodes
    that end at −100, each with its 95% interval (over the seeds' means), and each one's difference from
    `baseline` with its interval and permutation p."""
    from empo2.stats import permutation_p, seed_difference, seed_interval

    scores = {label: [final_test_scores(f) for f in chosen] for label, chosen in folders.items()}
    rows = []
    for label, per_seed in scores.items():
        row = {"policy": label, "seeds": len(per_seed), "test episodes": int(sum(len(s) for s in per_seed))}
        for name, values in (("score", per_seed), ("ended at −100", [failed(s) for s in per_seed])):
            mean, low, high = seed_interval(values)
            row |= {name: mean, f"{name} 95% low": low, f"{name} 95% high": high}
            if label != baseline:
                base = scores[baseline] if name == "score" else [failed(s) for s in scores[baseline]]
                difference, low, high = seed_difference(values, base)
                row |= {f"{name} vs {baseline}": difference, f"{name} vs {baseline} 95% low": low,
                        f"{name} vs {baseline} 95% high": high, f"{name} vs {baseline} p": permutation_p(values, base)}
        rows.append(row)
    return pd.DataFrame(rows).set_index("policy")


def save_figure(figure, name: str, results_dir: str = "results") -> None:
    """Save a matplotlib figure as results/figures/<name>.png (150 dpi).

    Returns None, so a notebook cell ending with this call shows the figure and nothing else.
    """
    path = Path(results_dir) / "figures" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=150, bbox_inches="tight")


def variant_runs(configs: dict[str, list[EMPO2Config]], force: bool = False
                 ) -> tuple[dict[str, list[Path]], pd.DataFrame]:
    """Train or reuse each labelled variant's runs (one per seed): their folders, and `variant_table`."""
    folders = {label: [run(cfg, force=force) for cfg in runs] for label, runs in configs.items()}
    return folders, variant_table(folders)


def variant_table(folders: dict[str, list[Path]]) -> pd.DataFrame:
    """One row per variant (its runs, one per seed): mean final test score with its 95% interval (over the
    seeds' means; over the test episodes for one seed), mean training score, the share of training episodes
    that ended at −100 in the first and the second half of the iterations, and how many training episodes each
    update mode played."""
    from empo2.stats import seed_interval

    rows = []
    for label, runs in folders.items():
        scores = [final_test_scores(f) for f in runs]
        mean, low, high = seed_interval(scores)
        frames = [metrics(f) for f in runs]
        first_half, second_half = (np.concatenate(half) for half in zip(*(fatal_endings_by_half(f) for f in runs)))
        modes = {f"{mode} episodes": int(sum(frame[f"train/episodes/{mode}"].sum() for frame in frames))
                 for mode in MODE_NAMES.values()}
        rows.append({"variant": label, "final test score": mean,
                     "95% low": low, "95% high": high, "seeds": len(runs),
                     "test episodes": int(sum(len(s) for s in scores)),
                     "mean training score": float(np.mean([frame["train/score"].mean() for frame in frames])),
                     "ended at −100, first half (%)": 100 * first_half.mean(),
                     "second half (%)": 100 * second_half.mean(),
                     "iterations": int(max(frame["iteration"].max() for frame in frames))} | modes)
    return pd.DataFrame(rows).set_index("variant").round(1)


def training_curve(folders: list[Path], window: int = 1, phase: str = "train", tip_free: bool = False
                   ) -> pd.DataFrame:
    """Notebooks 04 and 11: per iteration, the mean episode score over runs (each run's mean first) and its 95%
    interval (over the runs' means; over the episodes for one run). `window` > 1 pools blocks of that many
    iterations (indexed by their last); `phase` "eval" gives the test episodes of each evaluation instead of
    the training ones; `tip_free` keeps only the episodes played without tips (EMPO²'s plain ones; the tests
    are all tip-free)."""
    from empo2.stats import seed_interval

    frames = [episodes(f) for f in folders]
    frames = [tip_free_rows(f) if tip_free else f for f in frames]
    played = [f[f["phase"] == phase].assign(block=lambda f: ((f["iteration"] - 1) // window + 1) * window)
              for f in frames]
    rows = []
    for block in sorted(set().union(*[set(f["block"]) for f in played])):
        groups = [f[f["block"] == block]["score"].to_numpy() for f in played]
        mean, low, high = seed_interval(groups)
        rows.append({"iteration": int(block), "score": mean, "95% low": low, "95% high": high})
    return pd.DataFrame(rows, columns=["iteration", "score", "95% low", "95% high"]).set_index("iteration")


def plot_variants(folders: dict[str, list[Path]], title: str, name: str, results_dir: str = "results") -> None:
    """Training score against iteration, and the tip-free test score, each the mean over a variant's runs with
    its 95% interval (over the runs' means), one colour per variant; saved as a figure. When each run was
    evaluated once (at its end), the test panel shows one point per variant instead of lines. Variants that
    score alike are drawn with markers of decreasing size, so that none hides another, and each score axis
    spans at least `MIN_SCORE_SPAN` points, so that a difference of one episode does not fill the panel."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
    tested = {label: training_curve(runs, phase="eval") for label, runs in folders.items()}
    once = all(len(curve) <= 1 for curve in tested.values())
    markers = "osD^v<>p"
    for i, (label, runs) in enumerate(folders.items()):
        style = dict(color=f"C{i}", marker=markers[i % len(markers)], markersize=max(3, 9 - 1.5 * i), label=label)
        trained = training_curve(runs)
        axes[0].plot(trained.index, trained["score"], linestyle=("-", "--", ":", "-.")[i % 4], **style)
        if len(runs) > 1:
            axes[0].fill_between(trained.index, trained["95% low"], trained["95% high"], color=f"C{i}", alpha=0.15)
        curve = tested[label]
        yerr = [curve["score"] - curve["95% low"], curve["95% high"] - curve["score"]]
        x = [i] * len(curve) if once else curve.index
        axes[1].errorbar(x, curve["score"], yerr=yerr, capsize=3, **style)
    axes[0].set(xlabel="iteration", ylabel="training episode score")
    axes[0].legend(fontsize=7)
    if once:
        axes[1].set_xticks(range(len(folders)), list(folders), rotation=30)
        axes[1].set(xlabel="variant (evaluated at the end of training)", ylabel="test score, 95% interval (no memory)")
    else:
        axes[1].set(xlabel="iteration", ylabel="test score, 95% interval (no memory)")
        axes[1].legend(fontsize=7)
    for ax in axes:
        low, high = ax.get_ylim()
        middle, span = (low + high) / 2, max(high - low, MIN_SCORE_SPAN)
        ax.set_ylim(middle - span / 2, middle + span / 2)
        ax.axhline(0, color="grey", lw=0.5)
    fig.suptitle(title)
    save_figure(fig, name, results_dir)


MIN_SCORE_SPAN = 20
"""The least range of a variant figure's score axes (ScienceWorld scores run from −100 to 100)."""


def enter_project_root() -> Path:
    """chdir to the repository root (notebooks run from notebooks/ in JupyterLab, from the root in papermill)."""
    import os

    here = Path.cwd()
    root = here if (here / "empo2").is_dir() else here.parent
    os.chdir(root)
    return root

