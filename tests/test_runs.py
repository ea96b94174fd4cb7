"""A run folder's checkpoints and rows: a run killed mid-write resumes from what was complete."""

import json

import pytest

from empo2.runs import RunFolder


def test_a_checkpoint_killed_while_being_written_leaves_the_previous_one_latest(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.start({"config": {}}, fresh=True)
    for iteration in (1, 2):
        with folder.new_checkpoint(iteration) as partial:
            (partial / "weights.pt").write_text(str(iteration))
    with pytest.raises(KeyboardInterrupt):
        with folder.new_checkpoint(3) as partial:
            (partial / "weights.pt").write_text("half")
            raise KeyboardInterrupt  # killed before the checkpoint was complete
    assert folder.latest_checkpoint().name == "iter-00002"
    assert (folder.latest_checkpoint() / "weights.pt").read_text() == "2"
    with folder.new_checkpoint(3) as partial:  # the resumed run writes it again
        (partial / "weights.pt").write_text("3")
    assert folder.latest_checkpoint().name == "iter-00003"
    assert sorted(p.name for p in folder.checkpoints.glob("iter-*")) == ["iter-00002", "iter-00003"]


def test_rows_after_the_checkpoint_and_a_torn_line_are_dropped_on_resume(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.start({"config": {}}, fresh=True)
    folder.append("metrics.jsonl", [{"iteration": 1}, {"iteration": 2}, {"iteration": 3}])
    with open(folder.path / "metrics.jsonl", "a") as handle:
        handle.write('{"iteration": 4, "train/sc')  # the process died mid-line
    folder.drop_rows_after(2)
    rows = [json.loads(line) for line in (folder.path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"iteration": 1}, {"iteration": 2}]
    folder.start({"config": {}}, fresh=True)  # a fresh start forgets every row
    assert not (folder.path / "metrics.jsonl").exists()


def test_files_written_whole_get_the_permissions_open_would_give(tmp_path):
    from empo2.runs import write_text_atomic

    write_text_atomic(tmp_path / "summary.json", "{}")
    (tmp_path / "plain.json").write_text("{}")
    assert (tmp_path / "summary.json").stat().st_mode == (tmp_path / "plain.json").stat().st_mode
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind
