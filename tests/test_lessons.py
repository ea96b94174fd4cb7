"""The helpers the lesson notebooks call (empo2.analysis.lessons) and the functions the notebooks define themselves
(`tests.notebook_code`), on the toy corridor with the real default policy."""

import json

import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch

from empo2.analysis import experiments, lessons, takeaways
from empo2.config import EMPO2Config
from empo2.episode import MODE_NAMES
from empo2.llm.models import default_dtype
from empo2.method.loss import policy_loss
from tests.notebook_code import defined_in


def _cfg(tmp_path, **overrides):
    values = dict(env="corridor", max_steps=3, response_tokens=4, tip_tokens=6, group_size=3, iterations=1,
                  eval_every=1, n_test_variations=2, results_dir=str(tmp_path), experiment="lessons")
    return EMPO2Config.from_profile("ci", **{**values, **overrides})


def test_cached_reuses_only_what_the_same_config_computed(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    calls = []
    compute = lambda: calls.append(1) or {"value": len(calls)}  # noqa: E731
    path = tmp_path / "saved" / "thing.json"
    assert lessons.cached(path, cfg, compute) == {"value": 1}
    assert lessons.cached(path, cfg, compute) == {"value": 1} and "reusing" in capsys.readouterr().out
    # The same settings read from another checkout location: still reused.
    moved = EMPO2Config.from_dict({**cfg.to_dict(), "results_dir": "elsewhere"})
    assert lessons.cached(path, moved, compute) == {"value": 1}
    assert lessons.cached(path, EMPO2Config.from_dict({**cfg.to_dict(), "max_steps": 4}), compute) == {"value": 2}
    assert "other settings" in capsys.readouterr().out
    assert lessons.cached(path, cfg, compute, force=True) == {"value": 3}
    saved = json.loads(path.read_text())
    assert saved["config"]["max_steps"] == 3 and "git_commit" in saved and "git_dirty" in saved
    assert saved["policy_dtype"] == str(default_dtype()) and "torch" in saved["packages"]
    assert lessons.cached(path, cfg, compute) == {"value": 3} and "by commit " in capsys.readouterr().out
    assert lessons.cached(path, cfg, compute, settings={"episodes": 2}) == {"value": 4}
    assert lessons.cached(path, cfg, compute, settings={"episodes": 2}) == {"value": 4}
    assert lessons.cached(path, cfg, compute, settings={"episodes": 3}) == {"value": 5}
    path.write_text(json.dumps({"value": "a file of the old format"}))
    assert lessons.cached(path, cfg, compute) == {"value": 6}


class _Recorder:
    def __init__(self):
        self.calls = []

    def update(self, n=1):
        self.calls.append(n)


def test_step_progress_moves_once_per_step_and_is_off_when_asked(monkeypatch):
    monkeypatch.setenv("EMPO2_PROGRESS", "1")
    progress = lessons.StepProgress(max_steps=5, episodes=2)
    for finished in (0, 1, 0, 1):
        progress.update(finished)
    assert (progress.steps, progress.finished, progress.bar.n) == (4, 2, 4)
    progress.close()
    monkeypatch.setenv("EMPO2_PROGRESS", "0")
    assert not experiments.progress_enabled()
    assert lessons.StepProgress(max_steps=5, episodes=2).bar.disable


def test_the_roller_reports_each_step_to_its_progress(tmp_path):
    from empo2.episode import PLAIN

    cfg = _cfg(tmp_path, max_steps=3)
    with lessons.untrained_roller(cfg, 2, memory=False) as lesson:
        recorder = _Recorder()
        episodes = lesson.roller.run(lesson.envs, [0, 1], [PLAIN, PLAIN], temperature=1.0, progress=recorder)
    assert len(recorder.calls) == max(len(e.turns) for e in episodes)  # one call per lock-step step
    assert sum(recorder.calls) == 2  # and together they count the finished episodes


def test_quickstart_and_exploration_play_real_episodes(tmp_path):
    cfg = _cfg(tmp_path)
    episode = defined_in("00_quickstart")["quickstart_episode"](cfg)
    assert episode["task"] == "corridor" and episode["tip"] and "Task:" in episode["first_prompt"]
    steps = pd.DataFrame(episode["steps"]).set_index("step")  # as notebook 00 shows it
    assert steps.index.dtype == np.int64 and list(steps.index) == list(range(1, len(steps) + 1))
    assert steps["score"].iloc[-1] == episode["score"]

    trajectories = defined_in("01_exploration_problem")["plain_then_with_memory"](cfg, episodes=2)
    assert [t["condition"] for t in trajectories] == ["plain", "plain", "with memory", "with memory"]
    assert all(t["tip"] for t in trajectories[:2])
    # Every state the memory-augmented episodes acted in is the corridor's, where the plain ones stored tips.
    assert any(turn["tips_shown"] for t in trajectories[2:] for turn in t["turns"])
    summary = lessons.trajectory_summary(trajectories)
    assert list(summary.index) == ["plain", "with memory"] and summary.notna().all().all()


def test_side_by_side_has_integer_steps_and_no_empty_cells():
    def turn(action, score, tips=0):
        return {"action": action, "score": score, "tips_shown": tips, "first_tip": ""}

    trajectories = [
        {"condition": "plain", "score": -100.0, "turns": [turn("a", 0.0), turn("focus on b", -100.0)]},
        {"condition": "with memory", "score": 7.0,
         "turns": [turn("a", 0.0, 3), turn("go c", 7.0, 2), turn("d", 7.0, 1)]},
    ]
    table = defined_in("01_exploration_problem")["side_by_side"](trajectories)
    assert list(table.index) == [(1, 1), (1, 2), (1, 3)]
    assert all(level.dtype == np.int64 for level in table.index.levels)
    assert not table.isna().any().any()
    assert table.loc[(1, 3), "plain action"] == "(over)" and table.loc[(1, 3), "plain score"] == -100
    assert table["plain score"].dtype == np.int64 and list(table["tips shown"]) == [3, 2, 1]


def test_memory_snapshot_retrieves_by_threshold_then_score(tmp_path):
    cfg = _cfg(tmp_path, top_k=2)
    view = defined_in("02_memory_and_tips")["memory_snapshot"](cfg, episodes=2)
    entries = pd.DataFrame(view["entries"])
    assert len(entries) and view["query_state"].startswith("You are in room 0")
    retrieved = entries[entries["retrieved"]]
    assert len(retrieved) == min(cfg.top_k, int((entries["similarity"] > cfg.similarity_threshold).sum()))
    assert (retrieved["similarity"] > cfg.similarity_threshold).all()
    candidates = entries[entries["similarity"] > cfg.similarity_threshold]
    assert retrieved["score"].min() >= candidates["score"].nlargest(cfg.top_k).min()


def test_importance_ratios_of_the_three_modes(tmp_path):
    cfg = _cfg(tmp_path, p=1.0, q=0.5, checkpoint_every=0, experiment="ratios")
    tokens = pd.DataFrame(defined_in("03_importance_ratios")["importance_ratios"](cfg))
    assert set(tokens["mode"]) == {"plain", "memory_on", "off_policy"}
    on_policy = tokens[tokens["mode"] != "off_policy"]
    # Before any update θ = θ_old and on-policy contexts are the same: every ratio is exactly 1.
    assert np.allclose(on_policy["new_before_update"], on_policy["old"], atol=1e-6)
    # Every token of an episode carries that episode's advantage.
    assert (tokens.groupby("episode")["advantage"].nunique() == 1).all()
    # A forced token (the only allowed continuation) has probability 1 in every context.
    assert np.allclose(tokens.loc[tokens["forced"], ["old", "new_before_update", "new_after_update"]], 0, atol=1e-5)
    table = lessons.ratio_table(tokens, cfg.delta)
    assert set(table.index) == {"plain", "memory_on", "off_policy"}
    assert table.loc["plain", "dropped_by_delta"] == 0 and table.loc["memory_on", "dropped_by_delta"] == 0
    assert table["tokens"].sum() == len(tokens) and table["decisions"].sum() == (~tokens["forced"]).sum()
    # Notebook 03 passes these rows to the loss itself: its δ mask drops the decisions the table counts as dropped.
    codes = {name: int(code) for code, name in MODE_NAMES.items()}
    _, metrics = policy_loss(*(torch.tensor(list(values), dtype=dtype) for values, dtype in (
        (tokens["new_before_update"], torch.float32), (tokens["old"], torch.float32),
        (tokens["advantage"], torch.float32), (~tokens["forced"], torch.float32),
        (tokens["mode"].map(codes), torch.long), (tokens["episode"] * 10_000 + tokens["turn"], torch.long))),
        **cfg.loss_settings)
    assert metrics["tokens"] == (~tokens["forced"]).sum()
    off = lessons.with_ratios(tokens, cfg.delta).query("mode == 'off_policy' and not forced")
    assert metrics["masked_frac/off_policy"] == pytest.approx(off["dropped_by_delta"].mean())
    everything = lessons.ratio_table(tokens, delta=1.0)  # δ = 1 drops every off-policy decision
    assert everything.loc["off_policy", "dropped_by_delta"] == 1.0


def test_tables_of_saved_runs(tmp_path):
    """Hand-made runs of two seeds each (GRPO also tested at iteration 1, every episode scoring 50): the tables read
    the last evaluation only, and a curve over runs averages each run's mean, not the pooled episodes."""
    from tests.test_known_differences import episode, write_run

    last = {  # (label, seed) -> the last evaluation's episodes: (variation, score, actions)
        ("GRPO", 0): [(5, 13.0, ["a", "b", "a"]), (6, -100.0, ["a", "a", "a", "a"])],
        ("GRPO", 1): [(5, 7.0, ["a", "b", "c"]), (6, 0.0, ["a", "b"])],
        ("Naive", 0): [(5, 0.0, ["a"]), (6, 7.0, ["a", "b"])],
        ("Naive", 1): [(5, -100.0, ["a", "a"]), (6, 0.0, ["a", "b", "b"])],
    }
    trained = {0: {1: [0.0, 7.0], 2: [-100.0, 13.0]}, 1: {1: [7.0, 13.0, 13.0], 2: [0.0, 0.0, 20.0]}}  # GRPO's
    folders = {"GRPO": [], "Naive": []}
    for (label, seed), tested in last.items():
        cfg = _cfg(tmp_path, method=label.lower(), seed=seed, iterations=2, group_size=2, eval_every=2)
        at = 0 if label == "Naive" else 2
        rows = [episode(at, "eval", s, variation=v, task="corridor", actions=a) for v, s, a in tested]
        if label == "GRPO":
            rows += [episode(i, "train", s, task="corridor") for i, scores in trained[seed].items() for s in scores]
            rows += [episode(1, "eval", 50.0, variation=v, task="corridor") for v in (5, 6)]
        folders[label].append(write_run(cfg.run_dir, cfg.to_dict(), rows))
    grpo, naive = folders["GRPO"], folders["Naive"]

    outcomes = lessons.test_outcomes({"GRPO": grpo, "Naive": naive})
    assert list(outcomes.index) == ["GRPO", "Naive"] and (outcomes["test episodes"] == 4).all()
    assert outcomes.drop(columns=["test episodes", "mean score"]).apply(lambda c: c.between(0, 1)).all().all()
    # GRPO: scores 13, -100, 7, 0; steps repeating an action: 1 of 3, 3 of 4, 0 of 3, 0 of 2.
    assert outcomes.loc["GRPO"].to_dict() == pytest.approx({
        "test episodes": 4, "ended at −100": 1 / 4, "left first room (≥ 7)": 2 / 4,
        "reached workshop (≥ 13)": 1 / 4, "repeated actions": (1 / 3 + 3 / 4) / 4,
        "mean score": (13 - 100 + 7 + 0) / 4})
    # Naive: scores 0, 7, -100, 0; repeating: 0 of 1, 0 of 2, 1 of 2, 1 of 3.
    assert outcomes.loc["Naive"].to_dict() == pytest.approx({
        "test episodes": 4, "ended at −100": 1 / 4, "left first room (≥ 7)": 1 / 4, "reached workshop (≥ 13)": 0,
        "repeated actions": (1 / 2 + 1 / 3) / 4, "mean score": (0 + 7 - 100 + 0) / 4})

    curve = experiments.training_curve(grpo)
    assert list(curve.index) == [1, 2]
    assert (curve["95% low"] <= curve["score"] + 1e-9).all() and (curve["score"] <= curve["95% high"] + 1e-9).all()
    # Each run's mean first (3.5 and 11 at iteration 1, -43.5 and 20/3 at 2; pooled: 8.0 and -13.4), then a t-interval
    # over those two means.
    for iteration, means in ((1, [3.5, 11.0]), (2, [-43.5, 20 / 3])):
        low, high = scipy.stats.ttest_1samp(means, 0.0).confidence_interval(0.95)
        assert curve.loc[iteration].to_dict() == pytest.approx({"score": np.mean(means), "95% low": low,
                                                                "95% high": high})

    by_variation = defined_in("04_scienceworld")["test_scores_by_variation"]({"GRPO": grpo, "Naive": naive})
    assert list(by_variation.columns[:4]) == ["decoding", "steps", "test episodes", "mean"]
    assert [c for c in by_variation.columns if c.startswith("variation ")] == ["variation 5", "variation 6"]
    cfg = _cfg(tmp_path)
    assert by_variation.loc["GRPO"].to_dict() == {"decoding": cfg.action_decoding, "steps": cfg.max_steps,
                                                  "test episodes": 4, "mean": -20.0, "variation 5": 10.0,
                                                  "variation 6": -50.0}
    assert by_variation.loc["Naive", "mean"] == pytest.approx((0 + 7 - 100 + 0) / 4)
    assert by_variation.loc["Naive", ["variation 5", "variation 6"]].tolist() == [-50.0, 3.5]


def _webshop_run(folder, method: str, skipped_first: bool, test_scores: tuple[float, float]):
    """A hand-written run: 2 iterations, 2 training episodes (the first buys), 2 test episodes (the first buys)."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"config": {"method": method, "seed": 0}}))
    first = {"iteration": 1, "time/iteration": 60.0} | ({"update/skipped": 1.0} if skipped_first else {})
    (folder / "metrics.jsonl").write_text(json.dumps(first) + "\n"
                                          + json.dumps({"iteration": 2, "time/iteration": 60.0}) + "\n")
    bought = ["search[red shirt]", "click[b0abc]", "click[buy now]"]
    searched_only = ["search[red shirt]", None, None, "click[next >]"]
    episodes = [("train", 1, bought, 0.0), ("train", 2, searched_only, 0.0),
                ("eval", 2, bought, test_scores[0]), ("eval", 2, searched_only, test_scores[1])]
    (folder / "episodes.jsonl").write_text("".join(
        json.dumps({"phase": p, "iteration": i, "actions": a, "score": s}) + "\n" for p, i, a, s in episodes))
    return folder


def test_webshop_behaviour_counts_buys_invalid_actions_and_skipped_updates(tmp_path):
    folder = _webshop_run(tmp_path / "grpo-webshop-seed0", "grpo", skipped_first=True, test_scores=(50.0, 0.0))
    row = defined_in("10_webshop")["webshop_behaviour"]([folder]).loc["grpo-webshop-seed0"]
    assert (row["searched"], row["opened a product"], row["bought"]) == (1.0, 0.5, 0.5)
    assert row["invalid actions %"] == pytest.approx(100 * (0 + 2 / 4) / 2)
    assert (row["score"], row["training episodes that bought"], row["updates skipped"]) == (25.0, 0.5, 0.5)


def test_webshop_takeaways_state_what_the_runs_hold(tmp_path):
    folders = [_webshop_run(tmp_path / "grpo-webshop-seed0", "grpo", skipped_first=True, test_scores=(50.0, 0.0)),
               _webshop_run(tmp_path / "empo2-webshop-seed0", "empo2", skipped_first=False, test_scores=(0.0, 0.0))]
    scripted = pd.DataFrame({"score": [100.0, 50.0], "success": [True, False]})
    text = takeaways.webshop_runs(folders, scripted)
    assert "GRPO 25.00 [" in text and "EMPO² 0.00 [0.00, 0.00] (0 % success, 1 seed)" in text
    assert "2 of 4 test episodes (all runs) bought something, and 2 of 4 training episodes; 0 of those" in text
    assert "GRPO skipped its update** in 1 of 2 iterations" in text
    assert "EMPO² skipped its update** in 0 of 2 iterations" in text
    assert "**EMPO² − GRPO**: -25.0 [" in text
    assert "scores 75.0 with 50 % success on 2 test goals" in text


def test_trial_gain_reads_late_minus_early_and_the_fatal_endings_per_kind_of_tips():
    # Two seeds, 6 trials of 2 episodes: "by_score" goes from one -100 in each early trial to +10 late.
    rows = [{"task": "t", "tips": tips, "seed": seed, "trial": trial, "score": score, "tip": "Avoid: look.",
             "actions": ["look"], "tip_cut": False}
            for tips in ("free", "by_score") for seed in (0, 1) for trial in range(1, 7)
            for score in ((0.0, 0.0) if tips == "free" else (-100.0, 0.0) if trial <= 3 else (10.0, 10.0))]
    gain = lessons.trial_gain(pd.DataFrame(rows))
    assert list(gain.index) == [("t", "free"), ("t", "by_score")]
    free, by_score = gain.loc[("t", "free")], gain.loc[("t", "by_score")]
    assert free["late - early"] == 0 and free["fatal, trials 1-3"] == 0 == free["fatal, trials 4-6"]
    assert by_score["trials 1-3"] == -50 and by_score["trials 4-6"] == 10 and by_score["late - early"] == 60
    assert by_score["fatal, trials 1-3"] == 0.5 and by_score["fatal, trials 4-6"] == 0
    assert free["95% low"] == free["95% high"] == 0 and free["p"] == 1
    # Paired over the two seeds, whose late − early agree (60 each): a t with 1 degree of freedom on a variance
    # no smaller than the episodes' own (early (-100, 0) × 3, variance 3000 over 6 episodes, late all 10).
    half = scipy.stats.t.ppf(0.975, 1) * np.sqrt(3000 / 6 / 2)
    assert (by_score["95% low"], by_score["95% high"]) == pytest.approx((60 - half, 60 + half))
    assert by_score["p"] == 0.5  # the smallest two runs can give
    assert by_score["tips naming their episode"] == 1 and by_score["tips cut"] == 0


def test_tip_trials_take_seeds_per_task_and_read_only_saved_studies(tmp_path):
    seeds = {"power-component": (0, 1), "test-conductivity": (0,)}
    settings = lambda task, seed: {"trials": 3, "episodes_per_trial": 2, "index": seed,  # noqa: E731
                                   "split": "train" if task == "power-component" else "test"}
    for task, task_seeds in seeds.items():
        for tips, fields in lessons.TIP_STUDY_CONDITIONS.items():
            for seed in task_seeds:
                cfg = EMPO2Config.from_profile("ci", task=task, seed=seed, results_dir=str(tmp_path),
                                               experiment="tips", **fields)
                path = tmp_path / "ci" / "tips" / f"trials-{task}-{tips}-seed{seed}.json"
                lessons.cached(path, cfg, lambda: [{"trial": 1, "score": 0.0}], settings=settings(task, seed))
    read = lessons.tip_trials("ci", str(tmp_path), seeds=seeds, trials=3, episodes_per_trial=2, saved_only=True)
    assert read.groupby("task")["seed"].unique().map(tuple).to_dict() == seeds
    assert len(read) == 3 * len(lessons.TIP_STUDY_CONDITIONS)
    more = {**seeds, "test-conductivity": (0, 1)}  # a study not saved: nothing is computed
    assert lessons.tip_trials("ci", str(tmp_path), seeds=more, trials=3, episodes_per_trial=2, saved_only=True) is None
