"""The CoinCollector study's views (`empo2.analysis.study`) read its committed runs as they are, draw every planned
contrast, and the claims table takes each contrast as planned."""

import shutil

import numpy as np
import pytest

from empo2.analysis import experiments, report, study, suite
from empo2.analysis.notebooks import ROOT


def _handmade_measures(seeds: int = 5) -> dict:
    """Every arm with `seeds` seeds of 200 games around a known mean (EMPO² 60, each other arm lower), and an
    entropy per iteration around a known level: the contrasts' true values are known."""
    rng = np.random.default_rng(1)
    means = {arm.label: 60.0 - 2 * i for i, arm in enumerate(suite.COIN_STUDY_ARMS)}
    test = {label: [np.full(200, m) + rng.normal(0, 2, 200) for _ in range(seeds)] for label, m in means.items()}
    entropy = {label: [np.full(20, 0.4) + rng.normal(0, 0.01, 20) for _ in range(seeds)] for label in means}
    return {"test": test, "entropy": entropy}


@pytest.fixture(params=["laptop", "ci"])
def study_copy(tmp_path, request):
    """(profile, a results folder holding a copy of the committed study runs of that profile): figures go there,
    not into results/. At laptop the runs committed so far; at ci both seeds of every arm."""
    profile = request.param
    shutil.copytree(ROOT / "results" / profile / "coin-study", tmp_path / profile / "coin-study",
                    ignore=shutil.ignore_patterns(".*", "checkpoints", "final_weights.pt"))
    return profile, tmp_path


def test_the_arm_table_counts_the_committed_runs_and_scores_their_tests(study_copy):
    profile, results = study_copy
    runs = study.tested_runs(profile, str(results))
    assert sum(len(r) for r in runs.values()) == sum(
        1 for folder in (results / profile / "coin-study").iterdir() if (folder / "summary.json").exists())
    labels = [arm.label for arm in suite.COIN_STUDY_ARMS]
    table = study.arm_table(labels, profile, str(results))
    for label in labels:
        assert table.loc[label, "seeds"] == len(runs[label])
        if runs[label]:
            scores = [experiments.final_test_scores(folder) for _, folder in runs[label]]
            assert all(len(s) == suite.COIN_STUDY_TEST_GAMES[profile] for s in scores)
            assert table.loc[label, "test score"] == pytest.approx(np.mean([s.mean() for s in scores]), abs=0.01)
            assert table.loc[label, "95% low"] <= table.loc[label, "test score"] <= table.loc[label, "95% high"]
            shown = [experiments.read_jsonl(folder / "episodes.jsonl")["tips_shown"] for _, folder in runs[label]]
            assert table.loc[label, "test episodes shown a tip (%)"] == pytest.approx(
                100 * np.mean([(tips > 0).mean() for tips in shown]), abs=0.01)
            if runs[label][0][0].method != "naive":  # Naive only tests
                shares = table.loc[label, [f"{mode} episodes an iteration" for mode in study.MODES]]
                assert shares.sum() == pytest.approx(runs[label][0][0].group_size, abs=0.02)  # one mode an episode
                memory = [experiments.training_episodes(cfg.run_dir).query("mode != 'plain'") for cfg, _ in runs[label]]
                if any(len(episodes) for episodes in memory):
                    assert table.loc[label, "memory episodes shown a tip (%)"] == pytest.approx(100 * np.mean(
                        [(episodes["tips_shown"] > 0).mean() for episodes in memory if len(episodes)]), abs=0.01)
                else:  # GRPO: no memory-guided episode
                    assert np.isnan(table.loc[label].get("memory episodes shown a tip (%)", np.nan))


def _progress(results, profile) -> tuple[dict[str, list[str]], str]:
    """`report.study_progress` read back: each arm's cells by label, and the line below the table."""
    table, note = report.study_progress(results, profile).split("\n\n")
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return {row[0]: row[1:] for row in rows}, note


def test_the_progress_table_counts_runs_tests_and_the_hours_they_took(study_copy):
    """The progress table of results/README.md: each arm's planned, finished and tested runs and its lane-hours
    (a run's and its test's own clocks); a test removed is counted out with exactly its hours."""
    profile, results = study_copy
    rows, note = _progress(results, profile)
    runs = study.tested_runs(profile, str(results))
    for label, configs in suite.coin_study_tests(profile, str(results)).items():
        planned, finished, tested, hours, _ = rows[label]
        assert (int(planned), int(finished), int(tested)) == (len(configs), len(runs[label]), len(runs[label]))
        minutes = sum(experiments.run_minutes(cfg.run_dir) + experiments.run_minutes(folder)
                      for cfg, folder in runs[label])
        assert float(hours) == pytest.approx(minutes / 60, abs=0.05)
    spent = float(note.removeprefix("Lane-hours spent: ").split(";")[0])
    assert spent == pytest.approx(sum(float(r[3]) for r in rows.values()), abs=0.05 * len(rows))
    to_come = [(int(r[0]) - int(r[1])) / int(r[1]) for r in rows.values() if int(r[1])]  # runs left per finished one
    left = float(note.split("so far: about ")[1].split(" ")[0])
    estimate = sum(share * float(r[3]) for share, r in zip(to_come, [r for r in rows.values() if int(r[1])]))
    assert left == pytest.approx(estimate, abs=0.5 + 0.05 * sum(to_come))

    label = next(label for label, pairs in runs.items() if pairs)  # the first arm with a tested run
    test = runs[label][0][1]
    test_hours = experiments.run_minutes(test) / 60
    shutil.rmtree(test)
    after, _ = _progress(results, profile)
    assert after[label][:2] == rows[label][:2] and int(after[label][2]) == int(rows[label][2]) - 1
    assert float(after[label][3]) == pytest.approx(float(rows[label][3]) - test_hours, abs=0.1)


def test_each_notebooks_figures_are_drawn_from_the_committed_runs(study_copy):
    profile, results = study_copy
    for notebook, (arms, planned) in study.IN_NOTEBOOK.items():
        table = study.plot_contrasts(list(planned), "t", f"{notebook}-contrasts", profile, str(results))
        assert list(table.index) == list(planned)
        seeds = {label: len(runs) for label, runs in study.tested_runs(profile, str(results)).items()}
        for name, row in table.iterrows():
            waiting = min(seeds[label] for label in study.CONTRASTS[name].weights) < 2
            assert (row["verdict"] == "waiting for runs") == waiting and np.isnan(row["estimate"]) == waiting
        study.plot_arms(list(arms), "t", f"{notebook}-arms", profile, str(results), entropy=notebook == "08")
        for figure in (f"{notebook}-contrasts", f"{notebook}-arms"):
            assert (results / "figures" / f"{figure}.png").stat().st_size > 10_000


def test_a_forest_plot_with_every_arm_in_shows_each_contrast_at_its_known_value(tmp_path, monkeypatch):
    """Hand-made measures, 5 seeds an arm: every planned contrast is computed (none waits), drawn, and its
    estimate is the value the arms' known means give, up to the seeds' noise (sd of a seed's mean 0.14)."""
    monkeypatch.setattr(study, "measures", lambda profile, results_dir="results": _handmade_measures())
    names = [c.name for c in suite.COIN_STUDY_CONTRASTS]
    table = study.plot_contrasts(names, "t", "all", "laptop", str(tmp_path))
    assert (tmp_path / "figures" / "all.png").exists() and not table["estimate"].isna().any()
    means = {arm.label: 60.0 - 2 * i for i, arm in enumerate(suite.COIN_STUDY_ARMS)}
    for c in suite.COIN_STUDY_CONTRASTS:
        truth = 0.0 if c.measure == "entropy" else sum(w * means[label] for label, w in c.weights.items())
        row = table.loc[c.name]
        assert abs(row["estimate"] - truth) < 1.0 and row["95% low"] < row["estimate"] < row["95% high"], c.name


def test_the_claims_table_takes_each_study_contrast_as_planned(monkeypatch):
    """With every arm in, the study's rows of the claims table quote `study.contrasts`, verdict included;
    with the committed runs, a contrast whose arms lack a second seed says what it waits for."""
    waiting = report.claims(ROOT / "results", "laptop", notebook="06")
    assert all(row.startswith("study contrast waiting for runs") or "[" in row for row in waiting["ours"])
    monkeypatch.setattr(study, "measures", lambda profile, results_dir="results": _handmade_measures())
    table = report.claims(ROOT / "results", "laptop", notebook="06")
    expected = study.contrasts(_handmade_measures(), ["off-policy updates: full − (q = 0)"]).iloc[0]
    row = table[table["claim"] == "Off-policy updates help"].iloc[0]
    assert f"{expected['estimate']:+.1f} [{expected['95% low']:+.1f}, {expected['95% high']:+.1f}]" in row["ours"]
    assert row["verdict"] == expected["verdict"] == "reproduced"
