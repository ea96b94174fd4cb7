"""The workshop's live experiment (`empo2.analysis.live`): GRPO and EMPO² trained side by side on the real
CoinCollector with the real offline policy, at the ci budget (2 iterations of a group of 2)."""

from empo2 import ROOT
from empo2.analysis import live


def test_side_by_side_says_which_groups_can_learn_and_a_second_call_replays_it(tmp_path, capsys):
    cfg = live.live_config("ci", seed=0, results_dir=str(tmp_path))
    path = tmp_path / "live.json"
    rows = live.watch(cfg, 2, path)
    printed = capsys.readouterr().out

    assert [(r["method"], r["iteration"]) for r in rows] == [("grpo", 1), ("empo2", 1), ("grpo", 2), ("empo2", 2)]
    assert all(live.show_row(r) in printed for r in rows)  # each iteration printed as it ended
    for row in rows:
        returns = [score + bonus for score, bonus in zip(row["scores"], row["novelty"])]
        assert len(returns) == cfg.group_size
        assert row["signal"] == (len(set(returns)) > 1)  # a signal exactly where the group's returns differ
        assert ("no learning signal" in live.show_row(row)) != row["signal"]
    assert all(bonus == 0 for r in rows if r["method"] == "grpo" for bonus in r["novelty"])
    assert all(bonus > 0 for r in rows if r["method"] == "empo2" for bonus in r["novelty"])
    # Before any update the two methods play the same first group: the comparison starts level.
    assert rows[0]["scores"] == rows[1]["scores"]
    # The live cell replays the start of the committed ci runs of the same config and seed, episode by episode.
    committed = {m: ROOT / "results" / "ci" / "coin" / f"{m}-coin-seed0" for m in live.METHODS}
    assert live.plays_like_runs(rows, committed)
    altered = [dict(rows[0], scores=[100 - score for score in rows[0]["scores"]])] + rows[1:]
    assert not live.plays_like_runs(altered, committed)
    table = live.summary(rows)
    assert table.loc["EMPO²", "with a learning signal"] == sum(r["signal"] for r in rows if r["method"] == "empo2")

    again = live.watch(cfg, 2, path)
    replayed = capsys.readouterr().out
    assert again == rows
    assert "reusing" in replayed and all(live.show_row(r) in replayed for r in rows)
