"""Comparing a saved run's episodes with replayed ones. The retraining itself is not run here: it costs a
training run, and `replay` calls `Trainer.train(stop_after=...)`, which the resume tests cover."""

import pytest

from empo2.method.replay import first_difference, replay


def _rows():
    return [{"iteration": 1, "phase": "train", "actions": ["look around", "take coin"], "score": 100.0},
            {"iteration": 1, "phase": "train", "actions": ["look around"], "score": 0.0}]


def test_identical_rows_agree_and_the_first_changed_field_is_named():
    assert first_difference(_rows(), _rows()) == (None, [])
    changed = _rows()
    changed[1]["actions"] = ["move east"]
    difference, _ = first_difference(_rows(), changed)
    assert difference.startswith("episode 1 (iteration 1, train), field 'actions'")
    assert "['look around']" in difference and "['move east']" in difference
    assert difference.endswith("episodes that differ, by field: actions in 1")


def test_missing_episodes_and_fields_one_side_lacks_are_reported():
    assert first_difference(_rows(), _rows()[:1])[0] == "2 saved episodes, 1 replayed"
    newer = [{**row, "tip_ids": [1, 2]} for row in _rows()]
    assert first_difference(_rows(), newer) == (None, ["tip_ids"])


def test_a_folder_without_a_run_is_a_one_line_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="run_dir: .* holds no config.json"):
        replay(tmp_path)
