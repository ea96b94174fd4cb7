"""Run-or-reuse: a finished run with the same config is reused; force=True retrains it."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np

from empo2.analysis import experiments
from empo2.analysis.experiments import training_curve
from empo2.analysis.notebooks import ROOT
from empo2.config import EMPO2Config
from empo2.llm.models import default_dtype


def _tiny(tmp_path, experiment):
    return EMPO2Config.from_profile("ci", env="corridor", experiment=experiment, results_dir=str(tmp_path), max_steps=2,
                                    response_tokens=4, tip_tokens=4, iterations=1, eval_every=1, n_test_variations=1)


def test_a_run_held_by_another_process_is_waited_for_then_reused(tmp_path):
    cfg = _tiny(tmp_path, "lock")
    experiments.run(cfg, show_progress=False)
    code = ("import json, sys; from empo2.analysis import experiments; from empo2.config import EMPO2Config; "
            "experiments.run(EMPO2Config.from_dict(json.loads(sys.argv[1])), show_progress=False)")
    with experiments.run_lock(cfg.run_dir):
        other = subprocess.Popen([sys.executable, "-c", code, cfg.to_json()], stdout=subprocess.PIPE, text=True,
                                 cwd=os.getcwd())
        waiting = other.stdout.readline()  # printed once it finds the run held
        assert f"is being trained by process {os.getpid()}" in waiting
        assert other.poll() is None  # and it waits for this process
    out, _ = other.communicate(timeout=120)
    assert other.returncode == 0 and "reusing" in out


def test_a_study_lane_moves_past_a_run_another_lane_holds_and_takes_it_once_free(tmp_path):
    folder = tmp_path / "study" / "arm-seed10"
    code = ("import sys; from pathlib import Path; from empo2.analysis import experiments\n"
            "with experiments.lane_claim(Path(sys.argv[1])) as mine: print(mine)")
    ask = lambda: subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True,  # noqa: E731
                                 timeout=120, cwd=os.getcwd()).stdout.strip()
    with experiments.lane_claim(folder) as mine:
        assert mine
        assert ask() == "False"  # answered at once, not waited for
    assert ask() == "True"


def test_finished_runs_are_reused_and_force_retrains(tmp_path, capsys):
    cfg = EMPO2Config.from_profile("ci", env="corridor", experiment="reuse", results_dir=str(tmp_path), max_steps=2,
                                   response_tokens=4, tip_tokens=4, iterations=1, eval_every=1, n_test_variations=1)
    folder = experiments.run(cfg, show_progress=False)
    metrics = folder / "metrics.jsonl"
    first = metrics.stat().st_mtime_ns
    assert experiments.is_finished(cfg)

    assert experiments.run(cfg, show_progress=False) == folder
    assert metrics.stat().st_mtime_ns == first and "reusing" in (out := capsys.readouterr().out)
    assert "made by commit " in out

    experiments.run(cfg, force=True, show_progress=False)
    assert metrics.stat().st_mtime_ns > first
    assert len(metrics.read_text().splitlines()) == 1  # retrained from scratch, not appended

    other = dataclasses.replace(cfg, lr=2e-4)
    assert not experiments.is_finished(other)  # a changed config is not reused
    saved = json.loads((folder / "config.json").read_text())
    assert saved["config"]["lr"] == cfg.lr
    assert saved["policy_dtype"] == str(default_dtype())  # the machine's choice, saved beside the config


def test_tip_free_training_scores_leave_out_the_episodes_played_with_tips():
    coin = ROOT / "results" / "laptop" / "coin"
    empo2, grpo = (experiments.training_episodes(coin / f"{m}-coin-seed0") for m in ("empo2", "grpo"))
    assert set(empo2["mode"]) == {"plain", "memory_on", "off_policy"} and set(grpo["mode"]) == {"plain"}
    plain = empo2[empo2["mode"] == "plain"]
    assert list(experiments.tip_free_training_scores(coin / "empo2-coin-seed0")) == list(plain["score"])
    assert len(experiments.tip_free_training_scores(coin / "grpo-coin-seed0")) == len(grpo)
    first_half = experiments.tip_free_training_scores(coin / "empo2-coin-seed0", range(1, 31))
    assert list(first_half) == list(plain[plain["iteration"] <= 30]["score"])
    curve = training_curve([coin / "empo2-coin-seed0"], window=30, tip_free=True)
    assert curve.loc[30, "score"] == first_half.mean() != training_curve([coin / "empo2-coin-seed0"],
                                                                           window=30).loc[30, "score"]


def test_a_variant_of_several_seeds_pools_its_runs(tmp_path):
    """variant_table: one row per variant, its score the mean of its runs' means with a t-interval over them (over
    the episodes for one seed), its counts their sums; on hand-made runs of 4 iterations (each also tested at
    iteration 2, every episode scoring 50)."""
    import pytest
    import scipy.stats

    from tests.test_known_differences import episode, write_run

    trained = {  # run -> iteration -> its training episodes (mode, score)
        "empo2-seed0": {1: [("plain", 0), ("plain", -100), ("memory_on", 7)], 2: [("plain", 7), ("off_policy", -100)],
                        3: [("plain", 13), ("memory_on", 7), ("off_policy", 0)], 4: [("plain", -100), ("plain", 7)]},
        "empo2-seed1": {1: [("plain", -100), ("memory_on", -100)], 2: [("plain", 0), ("plain", 7)],
                        3: [("plain", 7), ("off_policy", 13)], 4: [("plain", 0)]},
        "grpo-seed0": {1: [("plain", 0), ("plain", -100)], 2: [("plain", 7), ("plain", 0)],
                       3: [("plain", -100), ("plain", 7)], 4: [("plain", 13), ("plain", 7)]},
    }
    tested = {"empo2-seed0": [7, 13, 13], "empo2-seed1": [0, 7, 20, 13, 0], "grpo-seed0": [0, 0, 7]}  # means 11, 8, 7/3
    folders = {}
    for run, iterations in trained.items():
        method, seed = run.split("-seed")
        cfg = EMPO2Config.from_profile("ci", env="corridor", method=method, seed=int(seed), iterations=4, eval_every=2,
                                       experiment="variants", results_dir=str(tmp_path))
        rows = [episode(i, "train", score, mode=mode, task="corridor") for i, played in iterations.items()
                for mode, score in played]
        rows += [episode(2, "eval", 50, task="corridor") for _ in tested[run]]
        rows += [episode(4, "eval", score, task="corridor") for score in tested[run]]
        folders[run] = write_run(cfg.run_dir, cfg.to_dict(), rows)
    seeds = [folders["empo2-seed0"], folders["empo2-seed1"]]
    table = experiments.variant_table({"two seeds": seeds, "seed 0": seeds[:1], "grpo": [folders["grpo-seed0"]]})
    rounded = lambda value: pytest.approx(value, abs=0.05 + 1e-9)  # noqa: E731  the table rounds to 0.1
    assert list(table["seeds"]) == [2, 1, 1]
    assert list(table["test episodes"]) == [8, 3, 3]
    # Two seeds: a t-interval over their means, 11 and 8 (the 8 episodes pooled: 7.5). One seed: over its episodes.
    for variant, values in (("two seeds", [11.0, 8.0]), ("seed 0", tested["empo2-seed0"]),
                            ("grpo", tested["grpo-seed0"])):
        low, high = scipy.stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
        assert table.loc[variant, ["final test score", "95% low", "95% high"]].tolist() == [
            rounded(np.mean(values)), rounded(low), rounded(high)]
    assert table.loc["two seeds", "final test score"] == 9.5

    # Each run's mean over iterations of its iterations' mean training score, then the mean over runs.
    iteration_means = {run: [np.mean([s for _, s in played]) for played in iterations.values()]
                       for run, iterations in trained.items()}
    assert table.loc["two seeds", "mean training score"] == rounded(
        np.mean([np.mean(iteration_means["empo2-seed0"]), np.mean(iteration_means["empo2-seed1"])]))
    # Training episodes at -100, both runs' episodes together: iterations 1-2, 4 of 9; iterations 3-4, 1 of 8.
    assert table.loc["two seeds", ["ended at −100, first half (%)", "second half (%)"]].tolist() == [
        rounded(100 * 4 / 9), rounded(100 * 1 / 8)]
    assert table.loc["seed 0", ["ended at −100, first half (%)", "second half (%)"]].tolist() == [
        rounded(100 * 2 / 5), rounded(100 * 1 / 5)]
    modes = ["plain episodes", "memory_on episodes", "off_policy episodes"]
    assert table.loc["two seeds", modes].tolist() == [6 + 5, 2 + 1, 2 + 1]
    assert table.loc["seed 0", modes].tolist() == [6, 2, 2]
    trained_count = sum(len(experiments.training_episodes(f)) for f in seeds)
    assert table.loc["two seeds", modes].sum() == trained_count == 17 > table.loc["seed 0", modes].sum()
    assert table.loc["grpo", modes[1:]].sum() == 0
    assert list(table["iterations"]) == [4, 4, 4]
