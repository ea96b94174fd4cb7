"""Run-or-reuse: a finished run with the same config is reused; force=True retrains it."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np

from empo2 import experiments
from empo2.config import EMPO2Config
from empo2.lessons import training_curve
from empo2.models import default_dtype
from empo2.notebooks import ROOT


def _tiny(tmp_path, experiment):
    return EMPO2Config.from_profile("ci", env="corridor", experiment=experiment, results_dir=str(tmp_path), max_steps=2,
                                    response_tokens=4, tip_tokens=4, iterations=1, eval_every=1, n_test_variations=1)


def test_a_run_held_by_another_process_is_waited_for_then_reused(tmp_path):
    cfg = _tiny(tmp_path, "lock")
    experiments.run(cfg, show_progress=False)
    code = ("import json, sys; from empo2 import experiments; from empo2.config import EMPO2Config; "
            "experiments.run(EMPO2Config.from_dict(json.loads(sys.argv[1])), show_progress=False)")
    with experiments.run_lock(cfg.run_dir):
        other = subprocess.Popen([sys.executable, "-c", code, cfg.to_json()], stdout=subprocess.PIPE, text=True,
                                 cwd=os.getcwd())
        waiting = other.stdout.readline()  # printed once it finds the run held
        assert f"is being trained by process {os.getpid()}" in waiting
        assert other.poll() is None  # and it waits for this process
    out, _ = other.communicate(timeout=120)
    assert other.returncode == 0 and "reusing" in out


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


def test_a_variant_of_several_seeds_pools_its_runs():
    """variant_table: one row per variant, its score the mean of its runs' means, its counts their sums."""
    runs = ROOT / "results" / "ci" / "power-component"
    seeds = [runs / f"empo2-power-component-seed{s}" for s in (0, 1)]
    table = experiments.variant_table({"two seeds": seeds, "seed 0": seeds[:1], "grpo": [runs / "grpo-power-component-seed0"]})
    per_seed = [experiments.final_test_scores(f) for f in seeds]
    assert list(table["seeds"]) == [2, 1, 1]
    assert table.loc["two seeds", "test episodes"] == sum(len(s) for s in per_seed)
    assert table.loc["two seeds", "final test score"] == round(float(np.mean([s.mean() for s in per_seed])), 1)
    modes = ["plain episodes", "memory_on episodes", "off_policy episodes"]
    trained = sum(len(experiments.training_episodes(f)) for f in seeds)
    assert table.loc["two seeds", modes].sum() == trained > table.loc["seed 0", modes].sum()
    assert table.loc["grpo", modes[1:]].sum() == 0
