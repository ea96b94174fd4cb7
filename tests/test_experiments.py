"""Run-or-reuse: a finished run with the same config is reused; force=True retrains it."""

import dataclasses
import json

from empo2 import experiments
from empo2.config import EMPO2Config


def test_finished_runs_are_reused_and_force_retrains(tmp_path, capsys):
    cfg = EMPO2Config.from_profile("ci", env="corridor", experiment="reuse", results_dir=str(tmp_path), max_steps=2,
                                   response_tokens=4, tip_tokens=4, iterations=1, eval_every=1, n_test_variations=1)
    folder = experiments.run(cfg, show_progress=False)
    metrics = folder / "metrics.jsonl"
    first = metrics.stat().st_mtime_ns
    assert experiments.is_finished(cfg)

    assert experiments.run(cfg, show_progress=False) == folder
    assert metrics.stat().st_mtime_ns == first and "reusing" in capsys.readouterr().out

    experiments.run(cfg, force=True, show_progress=False)
    assert metrics.stat().st_mtime_ns > first
    assert len(metrics.read_text().splitlines()) == 1  # retrained from scratch, not appended

    other = dataclasses.replace(cfg, lr=2e-4)
    assert not experiments.is_finished(other)  # a changed config is not reused
    saved = json.loads((folder / "config.json").read_text())["config"]
    assert saved["lr"] == cfg.lr
