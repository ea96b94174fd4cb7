"""The CoinCollector study, planned in `suite` (`COIN_STUDY_ARMS`, `COIN_STUDY_CONTRASTS`): the measures of its
finished, tested runs, each planned contrast with its interval, and what notebooks 06, 07, 08 and 11 lead with:
a forest plot of contrasts, the arms' curves and a table of the arms."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from empo2.analysis import experiments, suite
from empo2.config import EMPO2Config
from empo2.episode import PLAIN
from empo2.stats import Seeds, contrast, contrast_p, interquartile_mean, iqm_difference, p_text, seed_interval, verdict

ENTROPY_ITERATIONS = 20
"""The `entropy` measure of the study: the last this many iterations' `train/entropy/plain`."""
MODES = ("plain", "memory_on", "off_policy")
"""The episode modes, as the trainer's metrics name them (tip-free, memory on-policy, memory off-policy)."""


IN_NOTEBOOK = {
    "06": (("EMPO²", "q = 0 (no off-policy updates)", "q = 1 (off-policy updates only)"),
           ("off-policy updates: full − (q = 0)", "on-policy updates with memory: full − (q = 1)")),
    "07": (("GRPO with the novelty bonus", "p = 0.1", "EMPO²", "p = 0.7", "q = 0 (no off-policy updates)", "q = 0.3",
            "q = 0.95", "q = 1 (off-policy updates only)"),
           ("p = 0.7 − p = 0.25", "q ordering: (q = 2/3) − mean of q = 0.3 and q = 0.95",
            "p trend: slope over p = 0, 0.1, 0.25 (per unit of p)",
            "q trend: slope over q = 0, 0.3, 2/3, 0.95, 1 (per unit of q)")),
    "08": (("EMPO²", "GRPO with the novelty bonus", "EMPO² without the novelty bonus", "GRPO"),
           ("novelty bonus, main effect", "memory, main effect", "memory × novelty, interaction",
            "novelty bonus and the policy's entropy, main effect")),
    "11": (("EMPO²", "GRPO", "Naive", "memory-only"),
           ("EMPO² − GRPO (primary)", "EMPO² − Naive (floor)", "EMPO² − memory-only (floor)")),
}
"""What each notebook leads with: (the arms it draws, the planned contrasts of its forest plot)."""
CONTRASTS = {c.name: c for c in suite.COIN_STUDY_CONTRASTS}
"""The planned contrasts by name."""


def tested_runs(profile: str, results_dir: str = "results") -> dict[str, list[tuple[EMPO2Config, Path]]]:
    """By arm label, its runs that are trained and tested: (the run's test config, the test's folder). Runs not
    finished or not yet tested are left out."""
    runs = {}
    for label, tests in suite.coin_study_tests(profile, results_dir).items():
        runs[label] = [(cfg, folder) for cfg in tests if (folder := experiments.saved_retest(cfg)) is not None]
    return runs


def measures(profile: str, results_dir: str = "results") -> dict[str, dict[str, list[np.ndarray]]]:
    """The study's measures of its tested runs (`tested_runs`), by measure and arm: "test", each run's scores on
    the study's held-out games; "entropy", each run's tip-free decision entropy over its last
    `ENTROPY_ITERATIONS` iterations (one value an iteration)."""
    found = {"test": {}, "entropy": {}}
    for label, runs in tested_runs(profile, results_dir).items():
        found["test"][label] = [experiments.final_test_scores(folder) for _, folder in runs]
        frames = [experiments.metrics(cfg.run_dir) for cfg, _ in runs]
        found["entropy"][label] = [frame["train/entropy/plain"].dropna().to_numpy()[-ENTROPY_ITERATIONS:]
                                   for frame in frames if "train/entropy/plain" in frame]
    return found


def contrasts(found: dict[str, dict[str, list[np.ndarray]]], names: list[str] | None = None) -> pd.DataFrame:
    """Each planned contrast (`suite.COIN_STUDY_CONTRASTS`, or those `names`) of the measures given (`measures`):
    its estimate, 95% t-interval, permutation p and verdict, or how many runs it still waits for (every arm
    needs 2)."""
    rows = []
    for c in (CONTRASTS[name] for name in (names or CONTRASTS)):
        arms = [found[c.measure].get(label, []) for label in c.weights]
        row = {"contrast": c.name, "measure": c.measure, "paper": c.paper or "no direction",
               "seeds": " / ".join(str(len(arm)) for arm in arms)}
        if min(len(arm) for arm in arms) < 2:
            rows.append(row | {"estimate": np.nan, "95% low": np.nan, "95% high": np.nan, "p": np.nan,
                               "verdict": "waiting for runs"})
            continue
        labels = list(c.weights)
        strata = [[labels.index(label) for label in stratum] for stratum in c.strata] or None
        estimate, low, high = contrast(arms, list(c.weights.values()))
        p = contrast_p(arms, list(c.weights.values()), strata)
        rows.append(row | {"estimate": estimate, "95% low": low, "95% high": high, "p": p,
                           "verdict": verdict(low, high, p, claim=bool(c.paper))})
    return pd.DataFrame(rows).set_index("contrast")


def iqm_view(found: dict[str, dict[str, list[np.ndarray]]]) -> pd.DataFrame:
    """A second view of the planned contrasts of two arms in test points (added after 16 runs were in; not
    planned): each arm's interquartile mean of its seeds' test scores (rliable's IQM, `stats.interquartile_mean`) and the
    difference with Yuen's 95% interval (`stats.iqm_difference`), or "waiting for runs" (every arm needs 2).
    A seed far from its arm's others moves an IQM less than a mean."""
    rows = []
    for c in CONTRASTS.values():
        if c.measure != "test" or sorted(c.weights.values()) != [-1, 1]:
            continue
        (first, _), (second, _) = sorted(c.weights.items(), key=lambda item: -item[1])
        arms = [found["test"].get(label, []) for label in (first, second)]
        row = {"contrast": c.name, "seeds": " / ".join(str(len(arm)) for arm in arms)}
        if min(len(arm) for arm in arms) < 2:
            rows.append(row | {"IQM": np.nan, "other IQM": np.nan, "difference": np.nan, "95% low": np.nan,
                               "95% high": np.nan})
            continue
        iqm = [float(interquartile_mean(Seeds.of(arm).means)) for arm in arms]
        difference, low, high = iqm_difference(*arms)
        rows.append(row | {"IQM": iqm[0], "other IQM": iqm[1], "difference": difference, "95% low": low,
                           "95% high": high})
    return pd.DataFrame(rows).set_index("contrast")


def unit(contrast_name: str) -> str:
    """What a planned contrast is measured in: test points, test points per unit of p or q (a trend), or nats."""
    if CONTRASTS[contrast_name].measure == "entropy":
        return "decision entropy, nats"
    if contrast_name.startswith("p trend"):
        return "test points per unit of p"
    if contrast_name.startswith("q trend"):
        return "test points per unit of q"
    return "test points"


def planned_seeds(contrast_name: str, profile: str) -> str:
    """The seeds the plan gives each arm of a contrast, in its arms' order: "10 / 5"."""
    planned = suite.coin_study(profile)
    return " / ".join(str(len(planned[label])) for label in CONTRASTS[contrast_name].weights)


def plot_contrasts(names: list[str], title: str, name: str, profile: str, results_dir: str = "results"
                   ) -> pd.DataFrame:
    """A forest plot of planned contrasts (`contrasts`), saved as a figure: each estimate with its 95% interval,
    0 marked and the paper's side (above 0, where the paper reports a direction) shaded, one panel for each
    unit (`unit`); a contrast still waiting for runs is listed with its seeds an arm. Returns their table."""
    import matplotlib.pyplot as plt

    table = contrasts(measures(profile, results_dir), names)
    units = list(dict.fromkeys(unit(n) for n in table.index))
    sizes = [sum(unit(n) == u for n in table.index) for u in units]
    fig, axes = plt.subplots(len(units), 1, figsize=(9, 0.75 * len(table) + 1.1 * len(units)), squeeze=False,
                             gridspec_kw=dict(height_ratios=sizes))
    for ax, shown in zip(axes[:, 0], units):
        rows = [(n, r) for n, r in table.iterrows() if unit(n) == shown]
        finite = [abs(v) for _, r in rows for v in (r["95% low"], r["95% high"]) if np.isfinite(v)]
        reach = max(finite + [0.1 if shown.startswith("decision") else 10.0]) * 1.15
        ax.set_xlim(-reach, reach)
        ax.axvspan(0, reach, color="tab:green", alpha=0.07, lw=0)
        ax.axvline(0, color="grey", lw=0.8)
        ys = range(len(rows) - 1, -1, -1)
        for y, (_, r) in zip(ys, rows):
            if np.isnan(r["estimate"]):
                ax.text(0, y, f"waiting for runs (seeds an arm: {r['seeds']}; every arm needs 2)", ha="center",
                        va="center", fontsize=8, color="dimgrey", bbox=dict(facecolor="white", edgecolor="none"))
                continue
            established = r["p"] < 0.05 and not r["95% low"] <= 0 <= r["95% high"]
            ax.errorbar(r["estimate"], y, xerr=[[r["estimate"] - r["95% low"]], [r["95% high"] - r["estimate"]]],
                        fmt="o", color="tab:green" if established else "tab:blue", capsize=4)
            ax.annotate(f"{r['estimate']:+.{3 if shown.startswith('decision') else 1}f}  (seeds {r['seeds']}, "
                        f"{p_text(r['p'])}: {r['verdict']})", (r["estimate"], y), textcoords="offset points",
                        xytext=(0, 7), ha="center", fontsize=7)
        ax.set_yticks(list(ys), [f"{n}\nthe paper: {r['paper']}" for n, r in rows], fontsize=7)
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.set_xlabel(f"{shown}: estimate and 95% interval (shaded: the paper's side)", fontsize=8)
    axes[0, 0].set_title(title)
    fig.tight_layout()
    experiments.save_figure(fig, name, results_dir)
    return table


def _blocks(values: pd.Series, window: int) -> pd.Series:
    """The mean of each block of `window` iterations (indexed by its last iteration) of a per-iteration series."""
    return values.groupby((values.index - 1) // window * window + window).mean()


def plot_arms(labels: list[str], title: str, name: str, profile: str, results_dir: str = "results",
              window: int = 5, entropy: bool = False) -> None:
    """The arms' tested runs, saved as a figure: the tip-free training score per block of `window` iterations
    (at most a quarter of the profile's), the mean over an arm's seeds with its 95% interval from 2 seeds on;
    with `entropy`, the tip-free decision entropy the same way (mean over seeds); and the study's test: each
    seed's mean score on the held-out games (dots) and the arm's mean with its 95% interval over seeds (over
    the games where an arm has one seed)."""
    import matplotlib.pyplot as plt

    runs = tested_runs(profile, results_dir)
    iterations = EMPO2Config.from_profile(profile, env="textworld_express", task="coin").iterations
    window = max(1, min(window, iterations // 4))  # at ci (2 iterations) one point an iteration
    panels = 3 if entropy else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 3.8))
    for i, label in enumerate(labels):
        folders = [cfg.run_dir for cfg, _ in runs[label]]
        style = dict(color=f"C{i}", label=f"{label} ({len(folders)} seed{'s' if len(folders) != 1 else ''})")
        curve = experiments.training_curve(folders, window=window, tip_free=True)  # empty for Naive: no training
        if len(curve):
            axes[0].plot(curve.index, curve["score"], marker="o", markersize=3, **style)
            if len(folders) > 1:
                axes[0].fill_between(curve.index, curve["95% low"], curve["95% high"], color=f"C{i}", alpha=0.15)
        per_run = [_blocks(frame.set_index("iteration")["train/entropy/plain"], window)
                   for frame in map(experiments.metrics, folders if entropy else []) if "train/entropy/plain" in frame]
        if per_run:
            axes[1].plot(pd.concat(per_run, axis=1).mean(axis=1), marker="o", markersize=3, **style)
        scores = [experiments.final_test_scores(folder) for _, folder in runs[label]]
        axes[-1].scatter([i] * len(scores), [s.mean() for s in scores], color=f"C{i}", s=12, alpha=0.6)
        if scores:
            mean, low, high = seed_interval(scores)
            axes[-1].errorbar(i + 0.15, mean, yerr=[[mean - low], [high - mean]], fmt="s", capsize=4, color=f"C{i}")
    axes[0].set(xlabel="iteration", ylabel=f"tip-free training score, mean of {window} iterations")
    axes[0].legend(fontsize=7)
    if entropy:
        axes[1].set(xlabel="iteration", ylabel="tip-free decision entropy (nats)")
    games = suite.COIN_STUDY_TEST_GAMES[profile]
    axes[-1].set_xticks(range(len(labels)), labels, rotation=25, ha="right", fontsize=7)
    axes[-1].set(xlim=(-0.5, len(labels) - 0.5), ylabel=f"test score on {games} held-out games")
    axes[-1].set_title("dots: seeds; squares: mean, 95% interval over seeds (over games for one seed)", fontsize=8)
    fig.suptitle(title)
    experiments.save_figure(fig, name, results_dir)


def arm_table(labels: list[str], profile: str, results_dir: str = "results") -> pd.DataFrame:
    """One row per arm, over its tested runs: seeds, the test score (mean over seeds, 95% interval) and the share of
    test episodes shown a tip (memory-only tests with its memory), the tip-free training score and decision
    entropy of the last `ENTROPY_ITERATIONS` iterations, the share of memory-guided training episodes shown a tip
    (the memory is kept per game: a game met for the first time has none), the episodes an iteration of each mode,
    and the share of groups with a learning signal (with one from the score alone)."""
    runs = tested_runs(profile, results_dir)
    rows = []
    for label in labels:
        row = {"arm": label, "seeds": len(runs[label])}
        if runs[label]:
            mean, low, high = seed_interval([experiments.final_test_scores(folder) for _, folder in runs[label]])
            row |= {"test score": mean, "95% low": low, "95% high": high, "test episodes shown a tip (%)": 100 * np.mean(
                [(experiments.read_jsonl(folder / "episodes.jsonl")["tips_shown"] > 0).mean() for _, folder in runs[label]])}
            frames = [(cfg, experiments.metrics(cfg.run_dir)) for cfg, _ in runs[label]]
            trained = [(cfg, frame) for cfg, frame in frames if "train/score" in frame]  # Naive only tests
            if trained:
                every = pd.concat([frame for _, frame in trained])
                played = [experiments.tip_free_training_scores(
                    cfg.run_dir, range(frame["iteration"].max() - ENTROPY_ITERATIONS + 1, frame["iteration"].max() + 1))
                    for cfg, frame in trained]
                if any(len(scores) for scores in played):  # memory-only plays none without tips
                    row[f"tip-free training score, last {ENTROPY_ITERATIONS} iterations"] = np.mean(
                        [scores.mean() for scores in played if len(scores)])
                if "train/entropy/plain" in every:
                    row[f"tip-free entropy, last {ENTROPY_ITERATIONS} iterations"] = np.mean(
                        [frame["train/entropy/plain"].tail(ENTROPY_ITERATIONS).mean() for _, frame in trained])
                memory = [episodes[episodes["mode"] != PLAIN.label] for episodes in
                          (experiments.training_episodes(cfg.run_dir) for cfg, _ in trained)]
                if any(len(episodes) for episodes in memory):  # GRPO plays none with memory
                    row["memory episodes shown a tip (%)"] = 100 * np.mean(
                        [(episodes["tips_shown"] > 0).mean() for episodes in memory if len(episodes)])
                row |= {column: every[metric].mean() * scale for column, metric, scale in (
                    *((f"{mode} episodes an iteration", f"train/episodes/{mode}", 1) for mode in MODES),
                    ("groups with signal (%)", "train/groups_with_signal", 100),
                    ("from the score alone (%)", "train/groups_with_score_signal", 100)) if metric in every}
        rows.append(row)
    return pd.DataFrame(rows).set_index("arm").round(2)
