"""Hand-made runs whose scores differ by a known amount: the table of claims, the index of runs and the takeaways
must find that amount, with the interval computed here by hand (scipy's Welch and one-sample t-intervals on the
seeds' means; for one run, the exact bootstrap distribution of the mean of its episodes).

`write_run` writes a run folder in the format the trainer writes (`empo2.runs`: config.json, metrics.jsonl,
episodes.jsonl, tips.jsonl, summary.json); other tests import it. In the main comparison written here (the
laptop profile's runs, `suite.main_comparison` and `suite.baselines`), EMPO²'s three seeds have mean final test
scores 10, 22 and 13 over 4, 6 and 8 test episodes, and GRPO's 4, 12 and 8 over 8, 4 and 6: EMPO² − GRPO is
15 − 8 = +7.0, with Welch's interval on those six seed means (25.5 wide). Each shortcut gives another answer:

- a method's test episodes pooled as if independent (the seed level dropped): 276/18 − 128/18 = +8.2, and an
  interval a third as wide (8.1);
- one seed only: 10 − 4 = +6.0;
- one episode standing for its seed (the episode level dropped: the first one): 13.3 − 6.7 = +6.7;
- the normal quantile instead of Student's t (3 seeds a side): an interval two thirds as wide (16.8);
- an earlier evaluation's test episodes counted: each trained run was also tested at iteration 20, every
  episode scoring 50.

The tip-free training episodes carry a known difference too: EMPO² − GRPO is 7 − 2 = +5.0, and EMPO²'s
training episodes with tips (every one scoring 50) are left out of it.
"""

from __future__ import annotations

import collections
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from empo2.analysis import report, suite, takeaways
from empo2.analysis.notebooks import ROOT
from empo2.config import EMPO2Config

COMMIT = "1234567" + "0" * 33
"""The git commit every hand-made run says it came from."""
SECONDS_AN_ITERATION = 60.0
SECONDS_AN_EVALUATION = 30.0


# ---------------------------------------------------------------------------------------------- writing runs
def episode(iteration: int, phase: str, score: float, *, mode: str = "plain", variation: int = 0,
            task: str = "power-component", actions=("look around",)) -> dict:
    """One row of episodes.jsonl, with the fields a committed run's rows have (`trainer.episode_row`)."""
    actions = list(actions)
    return {"iteration": iteration, "phase": phase, "task": task, "variation": variation, "mode": mode,
            "score": float(score), "intrinsic": 0.0, "advantage": None if phase == "eval" else 0.0,
            "steps": len(actions), "success": bool(score >= 100), "truncated": bool(-100 < score < 100),
            "env_restarts": 0, "actions": actions, "raw_actions": actions, "tips_shown": int(mode != "plain"),
            "tip": "", "tip_ids": [], "tip_cut": False}


def metrics_rows(episodes: list[dict]) -> list[dict]:
    """metrics.jsonl of a run that played `episodes`: one row an iteration, its training episodes' counts and mean
    score, its test episodes' mean score, and `SECONDS_AN_ITERATION` (`SECONDS_AN_EVALUATION`) of work."""
    rows = []
    for iteration in sorted({e["iteration"] for e in episodes}):
        row = {"iteration": iteration}
        trained = [e for e in episodes if e["iteration"] == iteration and e["phase"] == "train"]
        tested = [e["score"] for e in episodes if e["iteration"] == iteration and e["phase"] == "eval"]
        if trained:
            row |= {"train/score": float(np.mean([e["score"] for e in trained])),
                    "train/success": float(np.mean([e["success"] for e in trained]))}
            row |= {f"train/episodes/{mode}": sum(e["mode"] == mode for e in trained)
                    for mode in ("plain", "memory_on", "off_policy")}
            row |= {"time/rollout": 0.8 * SECONDS_AN_ITERATION, "time/memory": 0.1 * SECONDS_AN_ITERATION,
                    "time/update": 0.2 * SECONDS_AN_ITERATION, "time/iteration": SECONDS_AN_ITERATION}
        if tested:
            row |= {"eval/score": float(np.mean(tested)), "eval/episodes": len(tested),
                    "time/evaluation": SECONDS_AN_EVALUATION}
        rows.append(row)
    return rows


def write_run(folder: Path, config: dict, episodes: list[dict], *, finished: bool = True) -> Path:
    """A run folder holding `episodes`, written by hand: config.json (`config`, the git commit `COMMIT`),
    metrics.jsonl (`metrics_rows`), episodes.jsonl, an empty tips.jsonl and, when `finished`, summary.json."""
    folder = Path(folder)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": config, "git_commit": COMMIT, "git_dirty": False,
                                                    "packages": {}}, indent=2))
    rows = metrics_rows(episodes)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (folder / "tips.jsonl").write_text("")
    if finished:
        (folder / "summary.json").write_text(json.dumps(rows[-1]))
    return folder


# ---------------------------------------------------------------------------------------------- the runs
TEST_SCORES = {  # method -> each seed's final test scores
    "empo2": ([7, 13, 13, 7], [20, 27, 20, 13, 27, 25], [13, 7, 20, 13, 13, 7, 20, 11]),  # means 10, 22, 13
    "grpo": ([0, 7, 7, 0, 7, 0, 7, 4], [13, 7, 13, 15], [7, 13, 7, 0, 7, 14]),  # means 4, 12, 8
    "naive": ([0, 0, 4, 0], [0, 7, 5, 0], [0, 7, 1, 0]),  # means 1, 3, 2
    "memory_only": ([7, 7, 13, 0, 13],),  # mean 8
}
TIP_FREE_TRAINING_MEANS = {"empo2": (5, 9, 7), "grpo": (2, 3, 1), "memory_only": (4,)}
"""Each seed's mean score of its tip-free training episodes (two an iteration, scoring the mean ∓ 1)."""
WITH_TIPS_SCORE = 50
"""The score of every EMPO² training episode played with tips (one an iteration): never a tip-free score."""
EARLIER_TEST_SCORE = 50
"""The score of every test episode of a trained run's evaluation at iteration 20: never a final test score."""


def main_comparison_episodes(cfg: EMPO2Config) -> list[dict]:
    """The episodes of one run of the main comparison or its baselines, from the tables above."""
    tested = TEST_SCORES[cfg.method][cfg.seed]
    if cfg.method == "naive":  # an evaluation of the untrained model, at iteration 0
        return [episode(0, "eval", s, variation=i % cfg.n_test_variations) for i, s in enumerate(tested)]
    rows = []
    mean = TIP_FREE_TRAINING_MEANS[cfg.method][cfg.seed]
    for iteration in range(1, cfg.iterations + 1):
        rows += [episode(iteration, "train", mean - 1), episode(iteration, "train", mean + 1)]
        if cfg.method == "empo2":
            rows.append(episode(iteration, "train", WITH_TIPS_SCORE, mode="memory_on"))
        if iteration in (cfg.iterations // 2, cfg.iterations):
            scores = [EARLIER_TEST_SCORE] * len(tested) if iteration < cfg.iterations else tested
            rows += [episode(iteration, "eval", s, variation=i % cfg.n_test_variations) for i, s in enumerate(scores)]
    return rows


def main_comparison_configs(results_dir: Path) -> list[EMPO2Config]:
    return suite.main_comparison("laptop", str(results_dir)) + suite.baselines("laptop", str(results_dir))


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory) -> Path:
    """A results folder holding the laptop profile's main comparison, every run written by hand."""
    results = tmp_path_factory.mktemp("results")
    for cfg in main_comparison_configs(results):
        write_run(cfg.run_dir, cfg.to_dict(), main_comparison_episodes(cfg))
    return results


# ---------------------------------------------------------------------------------------------- by hand
def welch(per_seed_a, per_seed_b) -> tuple[float, float, float]:
    """A's mean of seed means − B's, with scipy's Welch 95% t-interval on the seed means."""
    a, b = [np.mean(s) for s in per_seed_a], [np.mean(s) for s in per_seed_b]
    low, high = scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    return float(np.mean(a) - np.mean(b)), float(low), float(high)


def over_seeds(per_seed) -> tuple[float, float, float]:
    """The mean of seed means with scipy's one-sample 95% t-interval on them."""
    means = [np.mean(s) for s in per_seed]
    low, high = scipy.stats.ttest_1samp(means, 0.0).confidence_interval(0.95)
    return float(np.mean(means)), float(low), float(high)


def split_p(per_seed_a, per_seed_b) -> float:
    """Two-sided p of the permutation test of the seed means: the share of all splits of the seeds into groups of
    A's and B's sizes whose difference of means is at least as far from 0 as the observed one."""
    means = [np.mean(s) for s in [*per_seed_a, *per_seed_b]]
    observed = abs(np.mean(means[: len(per_seed_a)]) - np.mean(means[len(per_seed_a):]))
    splits = list(itertools.combinations(range(len(means)), len(per_seed_a)))
    far = [abs(np.mean([means[i] for i in s]) - np.mean([means[i] for i in range(len(means)) if i not in s]))
           >= observed - 1e-9 for s in splits]
    return sum(far) / len(splits)


def signed(difference: float, low: float, high: float) -> str:
    return f"{difference:+.1f} [{low:+.1f}, {high:+.1f}]"


def exact_bootstrap_quantile(scores, probability: float) -> float:
    """The `probability` quantile of the mean of len(scores) draws with replacement from the integer `scores`,
    exactly: the distribution of the draws' sum is the one-draw distribution convolved with itself."""
    values = np.asarray(scores, dtype=int)
    one_draw = np.bincount(values - values.min()) / len(values)
    total = np.ones(1)
    for _ in values:
        total = np.convolve(total, one_draw)
    first_reaching = int(np.searchsorted(np.cumsum(total), probability - 1e-12))
    return (first_reaching + len(values) * values.min()) / len(values)


def verdict_of(low: float, high: float, p: float) -> str:
    """A claim's verdict by the rule of `empo2.stats`: within the noise where the interval holds 0; established
    where it excludes 0 and p < 0.05; else not established."""
    if low <= 0 <= high:
        return "within the noise"
    side = "same direction" if low > 0 else "opposite direction"
    return ("reproduced" if low > 0 else "opposite") if p < 0.05 else f"{side}, not established"


def tip_free_training(method: str) -> list[list[float]]:
    """Each seed's tip-free training scores (their mean is all that the difference reads, with their count)."""
    return [[m - 1, m + 1] for m in TIP_FREE_TRAINING_MEANS[method]]


# ---------------------------------------------------------------------------------------------- the tests
def test_the_hand_made_runs_have_the_fields_of_a_committed_run(results_dir):
    """What `write_run` writes reads like a real run: the same episode fields, metric names the trainer writes,
    and a config of every field."""
    committed = ROOT / "results" / "ci" / "power-component" / "empo2-power-component-seed0"
    real_episode = json.loads((committed / "episodes.jsonl").read_text().splitlines()[0])
    real_metrics = set().union(*(json.loads(line) for line in (committed / "metrics.jsonl").read_text().splitlines()))
    folder = main_comparison_configs(results_dir)[0].run_dir
    written = [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]
    assert all(set(row) == set(real_episode) for row in written)
    metric_names = set().union(*(json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()))
    assert metric_names <= real_metrics
    saved = json.loads((folder / "config.json").read_text())
    assert set(saved["config"]) == set(EMPO2Config().to_dict()) and {"git_commit", "git_dirty"} <= set(saved)


def test_the_claims_find_the_known_differences_with_welch_intervals_over_the_seed_means(results_dir):
    table = report.claims(results_dir, "laptop", notebook="04").set_index("claim")
    empo2, grpo, naive, memory_only = (TEST_SCORES[m] for m in ("empo2", "grpo", "naive", "memory_only"))

    difference, low, high = welch(empo2, grpo)
    assert difference == pytest.approx(7.0)
    p = split_p(empo2, grpo)
    row = table.loc["EMPO² learns more than GRPO"]
    assert row["ours"] == f"EMPO² − GRPO {signed(difference, low, high)} (3 vs 3 seeds, p = {p:.2f})"
    assert row["verdict"] == verdict_of(low, high, p) == "within the noise"

    for claim, label, a, b in (("GRPO training beats the untrained model", "GRPO − Naive", grpo, naive),
                               ("EMPO² training beats the untrained model", "EMPO² − Naive", empo2, naive)):
        difference, low, high = welch(a, b)
        p = split_p(a, b)
        assert table.loc[claim, "ours"] == f"{label} {signed(difference, low, high)} (3 vs 3 seeds, p = {p:.2f})"
        assert table.loc[claim, "verdict"] == verdict_of(low, high, p)

    trained = welch(tip_free_training("empo2"), tip_free_training("grpo"))
    assert trained[0] == pytest.approx(5.0)
    assert (f"EMPO² − GRPO, tip-free training episodes {signed(*trained)} (3 vs 3 seeds"
            in table.loc["EMPO² learns faster than GRPO: its tip-free training episodes score higher", "ours"])

    # One seed of memory-only: the difference is still the mean of EMPO²'s seed means (15) minus memory-only's (8).
    lone = table.loc["EMPO² beats a memory of tips without weight updates", "ours"]
    difference = np.mean([np.mean(s) for s in empo2]) - np.mean(memory_only[0])
    assert lone.startswith(f"EMPO² − memory-only {difference:+.1f} [") and "(3 vs 1 seeds, " in lone


def test_the_index_of_runs_finds_each_runs_mean_with_a_bootstrap_interval_over_its_episodes(results_dir):
    table = report.runs_table(results_dir, "laptop")
    configs = {cfg.run_dir: cfg for cfg in main_comparison_configs(results_dir)}
    assert len(table) == len(configs)
    for row, folder in zip(table.to_dict("records"), report.run_folders(results_dir, "laptop")):
        cfg = configs[folder]
        scores = TEST_SCORES[cfg.method][cfg.seed]
        assert (row["method"], row["seed"], row["test episodes"]) == (cfg.method, cfg.seed, len(scores))
        assert row["score"] == pytest.approx(np.mean(scores), abs=1e-12)
        # 10,000 resamples put the 2.5% and 97.5% points, but for their sampling error (about 0.0016 in
        # probability), at those of the exact bootstrap distribution: between its 1.5% and 3.5% points.
        assert exact_bootstrap_quantile(scores, 0.015) <= row["low"] <= exact_bootstrap_quantile(scores, 0.035)
        assert exact_bootstrap_quantile(scores, 0.965) <= row["high"] <= exact_bootstrap_quantile(scores, 0.985)
        evaluations = 1 if cfg.method == "naive" else 2
        iterations = 0 if cfg.method == "naive" else cfg.iterations
        minutes = (iterations * SECONDS_AN_ITERATION + evaluations * SECONDS_AN_EVALUATION) / 60
        assert row["minutes"] == pytest.approx(minutes) and row["finished"]
        assert row["commit"] == COMMIT[:7]
    by_method = table.groupby("method")["score"].mean()
    assert by_method["empo2"] - by_method["grpo"] == pytest.approx(7.0)


def test_the_main_comparison_takeaways_find_the_known_differences(results_dir):
    text = takeaways.main_comparison("laptop", str(results_dir))
    lines = {line.split("**")[1]: line for line in text.splitlines() if line.startswith("- **")}
    for name, method in (("GRPO", "grpo"), ("EMPO²", "empo2")):
        mean, low, high = over_seeds(TEST_SCORES[method])
        assert f"{name} {mean:.1f} [{low:.1f}, {high:.1f}] (3 seeds)" in lines["Final test scores"]
    assert f"memory-only {np.mean(TEST_SCORES['memory_only'][0]):.1f} [" in lines["Final test scores"]

    for label, a, b in (("GRPO − Naive", "grpo", "naive"), ("EMPO² − Naive", "empo2", "naive"),
                        ("EMPO² − GRPO", "empo2", "grpo")):
        difference, low, high = welch(TEST_SCORES[a], TEST_SCORES[b])
        p = split_p(TEST_SCORES[a], TEST_SCORES[b])
        words = ("within the noise" if low <= 0 <= high else ("above 0" if low > 0 else "below 0")
                 + (" outside the noise" if p < 0.05 else ", not established"))
        assert f"{label} {signed(difference, low, high)} (3 vs 3 seeds, p = {p:.2f}, {words})" in lines["Differences"]
    assert "EMPO² − GRPO +7.0 [" in lines["Differences"]

    counts = collections.Counter(s for seed in TEST_SCORES["empo2"] for s in seed)
    by_score = ", ".join(f"{counts[v]} × {v:g}" for v in sorted(counts))
    assert lines["Test episodes by score"].split("; EMPO² ")[1] == f"{by_score}."

    speed = welch(tip_free_training("empo2"), tip_free_training("grpo"))
    assert f"the whole run {signed(*speed)}" in lines["Learning speed"]
