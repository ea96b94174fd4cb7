"""The real TextWorldExpress wrapper (JVM via py4j): CoinCollector, on tiny budgets, and a ci training on it."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import pytest

from empo2.analysis import experiments, lessons
from empo2.config import EMPO2Config
from empo2.envs import make_env
from empo2.envs import GameError
from tests.notebook_code import defined_in
from empo2.envs.jvm import running_jvm_pids
from empo2.envs.textworld_express import (ACTION_TEMPLATES, DEFAULT_PARAMS, GAME_NAMES, GAME_PARAMETERS, GAMES_PER_FOLD,
                                          TextWorldExpressEnv, TextWorldExpressGame)
from empo2.method.trainer import Trainer


@pytest.fixture(scope="module")
def coin():
    env = make_env("textworld_express", "coin", max_steps=40)
    yield env
    env.close()


def test_bad_game_name_is_a_clear_error_and_starts_no_jvm():
    before = set(running_jvm_pids())
    with pytest.raises(ValueError, match="unknown game 'coins'.*coin"):
        TextWorldExpressGame("coins")
    assert set(running_jvm_pids()) == before
    with pytest.raises(ValueError, match="task: 'coins' is not a TextWorldExpress game; choose one of coin"):
        EMPO2Config.from_profile("laptop", env="textworld_express", task="coins")


def test_each_games_parameters_and_folds_are_the_simulators(coin):
    """The keys of GAME_PARAMETERS are the ones the simulator names when it refuses an unknown key; it generates a
    game at both ends of each documented range; where it checks a range itself, one past either end is refused; a
    value that is no integer makes it fail silently, which is why the config checks first; each fold has
    GAMES_PER_FOLD games whatever the difficulty."""
    sim = TextWorldExpressEnv(envStepLimit=100)
    try:
        for game in GAME_NAMES:
            with pytest.raises(ValueError, match=r"Unrecognized property name \(noSuchKey\)") as refused:
                sim.load(game, "noSuchKey=1")
            listed = str(refused.value).split("Known properties:")[1].strip().rstrip(".").split(", ")
            known = {key.removesuffix("None") for key in listed} - {""}  # "None", or simonsays' "..., verboseNone"
            assert set(GAME_PARAMETERS[game]) == known, game
            for key, (low, high) in GAME_PARAMETERS[game].items():
                for value in (low, high):
                    sim.load(game, f"{key}={value}")
                    observation, infos = sim.reset(seed=0, gameFold="train")
                    reported = sim.getGenerationProperties().get(key, value)  # simonsays reports only some keys
                    assert reported == value and any(infos["validActions"]), (game, key, value)
                for value in (low - 1, high + 1):  # the simulator refuses these, or the config does
                    try:
                        sim.load(game, f"{key}={value}")
                    except ValueError:
                        continue
                    with pytest.raises(ValueError, match=f"game_params: '{key}={value}' is not allowed"):
                        EMPO2Config.from_profile("ci", env="textworld_express", task=game, game_params=f"{key}={value}")
            sim.load(game, "")
            assert [len(sim.getValidSeedsTrain()), len(sim.getValidSeedsDev()), len(sim.getValidSeedsTest())] == [
                GAMES_PER_FOLD] * 3
        sim.load("coin", "numLocations=abc")  # accepted without a word, and then no game starts
        observation, infos = sim.reset(seed=0, gameFold="train")
        assert observation.startswith("ERROR") and not any(infos["validActions"])
    finally:
        sim.close()


def test_a_game_that_cannot_start_is_an_error_before_any_episode():
    """Past the config's check (a caller may build the environment directly), the environment itself refuses: the
    simulator's own refusal, or a game that did not start, is a GameError, and no JVM is left behind."""
    before = set(running_jvm_pids())
    with pytest.raises(ValueError, match="game_params: 'numLocations=abc' is not allowed; numLocations of coin"):
        TextWorldExpressGame("coin", game_params="numLocations=abc")
    assert set(running_jvm_pids()) == before
    with TextWorldExpressGame("coin", game_params="numLocations=4") as game:
        game.game_params = "numLocations=abc"  # parameters the simulator cannot read, past every check
        game._start(None, gold=False)
        with pytest.raises(GameError, match="coin: game 0 did not start with game_params 'numLocations=abc': ERROR"):
            game.reset(0)
        game.game_params = "numLocations=0"
        with pytest.raises(GameError, match="refused by the simulator: Number of locations must be"):
            game._start(None, gold=False)
    with pytest.raises(GameError, match="mapreader: game 0 did not start .*No locations could be found"):
        TextWorldExpressGame("mapreader", game_params="numLocations=4")  # in range, yet its first game fails
    assert set(running_jvm_pids()) == before


def test_games_folds_and_bad_variation(coin):
    assert coin.simulator_game_names() == sorted(GAME_NAMES, key=coin.simulator_game_names().index)
    assert set(coin.simulator_game_names()) == set(GAME_NAMES)
    assert coin.game_params == DEFAULT_PARAMS["coin"]
    assert coin.train_variations == [0, 1, 2, 3, 4]
    assert coin.test_variations[:2] == [20000, 20001] and len(coin.test_variations) == 20
    for bad in (-1, 5000, 99999, True):
        with pytest.raises(ValueError, match=r"not a game seed; allowed: train 0\.\.999, dev 10000\.\.10999"):
            coin.reset(bad)


def test_heap_cap_and_owner_tag_are_on_the_java_command_line(coin):
    with open(f"/proc/{coin.jvm_pid}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    assert os.path.basename(argv[0]) == "java" and "-Xmx256m" in argv
    assert coin.jvm_pid in running_jvm_pids()


def test_reset_info_and_the_first_turn(coin):
    observation, info = coin.reset(coin.train_variations[0])
    assert observation.startswith("You are in the kitchen")
    assert info["valid_actions"] == sorted(info["valid_actions"]) and "look around" in info["valid_actions"]
    assert "coin" in info["task_description"] and info["score"] == 0 and info["variation"] == 0
    text = coin.first_turn_text(info["task_description"], observation, info)
    assert ACTION_TEMPLATES["coin"] in text and "find the coin" in text and "You are in the kitchen" in text
    assert "Actions you can take now" not in coin.next_turn_text("You open the door.", info, 2, 20)


@pytest.mark.parametrize("variation", [3, 20004])
def test_the_gold_path_takes_the_coin_with_score_100(coin, variation):
    gold = coin.gold_actions(variation)
    assert gold[-1] == "take coin"
    _, info = coin.reset(variation)
    rewards = []
    for action in gold:
        assert action in info["valid_actions"]
        result = coin.step(action)
        rewards.append(result.reward)
        info = result.info
        assert result.info["executed_action"] == action and result.info["exact_match"]
        if result.done:
            break
    assert result.done and not result.truncated and result.info["completed"]
    assert result.score == 100 and sum(rewards) == 100 and len(rewards) == len(gold)
    with pytest.raises(RuntimeError, match="reset"):
        coin.step("look around")


def test_step_limit_and_snapping():
    with TextWorldExpressGame("coin", max_steps=3) as env:
        _, info = env.reset(1)
        result = env.step("walk through the door to the south please")
        assert result.info["executed_action"] in info["valid_actions"] and not result.info["exact_match"]
        result = env.step("look around")
        assert not result.done
        result = env.step("inventory")
        assert result.done and result.truncated and result.score == 0 and not result.info["completed"]


def test_dead_jvm_restarts_and_close_leaves_nothing():
    before = set(running_jvm_pids())
    env = TextWorldExpressGame("coin")
    try:
        env.reset(0)
        old_pid = env.jvm_pid
        os.kill(old_pid, signal.SIGKILL)
        result = env.step("look around")
        assert result.done and result.truncated and result.info["env_restarted"] and env.restarts == 1
        assert env.jvm_pid != old_pid and not os.path.exists(f"/proc/{old_pid}")  # reaped
        observation, info = env.reset(0)
        assert observation.startswith("You are in the kitchen") and not info["env_restarted"]
        assert set(running_jvm_pids()) - before == {env.jvm_pid}
    finally:
        env.close()
        env.close()  # idempotent
    assert set(running_jvm_pids()) == before


def test_profiles_name_the_game_and_its_folder():
    cfg = EMPO2Config.from_profile("laptop", env="textworld_express")
    assert (cfg.task, cfg.experiment, cfg.name) == ("coin", "coin", "empo2-coin-seed0")
    assert cfg.tip_decoding == "constrained" and cfg.action_decoding == "constrained"
    assert str(cfg.run_dir) == "results/laptop/coin/empo2-coin-seed0"


def test_ci_training_on_the_real_game(tmp_path, capsys):
    """EMPO² at the ci budget on CoinCollector: real JVMs, the real model, constrained actions and tips. Then
    notebook 11's second look (`experiments.retest`): the final policy on more test games, beside the run; the
    first games replay the run's final evaluation (its test episodes fill whole groups), and a saved retest is
    read, not played again."""
    before = set(running_jvm_pids())
    cfg = EMPO2Config.from_profile("ci", env="textworld_express", method="empo2", p=1.0, results_dir=str(tmp_path),
                                   n_test_variations=2)
    trainer = Trainer(cfg, show_progress=False)
    try:
        last = trainer.train()
    finally:
        trainer.close()
    assert set(running_jvm_pids()) == before
    assert last["iteration"] == cfg.iterations and "eval/score" in last
    episodes = [json.loads(line) for line in (cfg.run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == cfg.iterations * cfg.group_size + cfg.n_test_variations * cfg.eval_samples
    tips = [json.loads(line) for line in (cfg.run_dir / "tips.jsonl").read_text().splitlines()]
    assert tips and all(t["tip"].startswith("Helpful:") and not t["tip_cut"] for t in tips)
    assert (cfg.run_dir / "summary.json").exists()
    # The tokens each episode carried, and each iteration's totals of them (what the cost is held against).
    for row in episodes:
        tokens = row["tokens"]
        assert tokens["context"] == tokens["prompt"] + tokens["response"] + tokens["tips"]
        assert tokens["response"] >= row["steps"] and tokens["tip_written"] == len(row["tip_ids"])
        assert (tokens["tips"] > 0) == (row["tips_shown"] > 0)  # evaluation plays without memory: no tips
    metrics = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in metrics:
        played = [e for e in episodes if e["phase"] == "train" and e["iteration"] == row["iteration"]]
        assert row["tokens/context"] == sum(e["tokens"]["context"] for e in played) > 0
        assert row["tokens/tips"] == sum(e["tokens"]["tips"] for e in played)
        if "update/skipped" not in row:
            assert row["update/tokens_read_with_gradient"] >= min(e["tokens"]["context"] - e["tokens"]["tips"]
                                                                  for e in played)
    assert last["eval/tokens/context"] == sum(e["tokens"]["context"] for e in episodes if e["phase"] == "eval")
    # The policy's entropy at its decisions, and the groups that carry a learning signal (all advantages 0: none).
    for row in metrics:
        played = [e for e in episodes if e["phase"] == "train" and e["iteration"] == row["iteration"]]
        assert all(e["entropy"] >= 0 for e in played)
        weighted = sum(e["entropy"] * e["decisions"] for e in played) / sum(e["decisions"] for e in played)
        assert row["train/entropy"] == pytest.approx(weighted)
        assert row["train/groups_with_signal"] == float(any(e["advantage"] != 0 for e in played))
        assert row["train/groups_with_score_signal"] == float(len({e["score"] for e in played}) > 1)

    records = {p: p.read_bytes() for p in cfg.run_dir.iterdir() if p.is_file()}
    more = dataclasses.replace(cfg, n_test_variations=2 * cfg.n_test_variations)
    assert experiments.saved_retest(more) is None
    retest = experiments.retest(more, show_progress=False)
    assert {p: p.read_bytes() for p in cfg.run_dir.iterdir() if p.is_file()} == records
    assert experiments.saved_retest(more) == retest and experiments.saved_retest(cfg) is None
    assert defined_in("11_empo2_on_a_laptop")["replayed_episodes"](cfg.run_dir, retest) == (2, 2)
    assert len(lessons.last_evaluation(retest)) == 4 and set(running_jvm_pids()) == before
    capsys.readouterr()
    assert experiments.retest(more, show_progress=False) == retest and "reusing" in capsys.readouterr().out


def test_coin_in_first_room_is_exactly_where_taking_the_coin_at_once_wins():
    """The split notebook 11 reads: where `coin_in_first_room` says so, `take coin` as the first action ends the
    game with 100; elsewhere the coin cannot be taken at the first step."""
    from empo2.analysis.lessons import coin_in_first_room

    cfg = EMPO2Config.from_profile("laptop", env="textworld_express", task="coin", n_test_variations=12)
    in_first_room = coin_in_first_room(cfg)
    assert len(in_first_room) == 12 and 0 < in_first_room.sum() < 12
    with TextWorldExpressGame("coin", game_params=cfg.game_params, n_test_variations=12) as env:
        for variation, first in in_first_room.items():
            _, info = env.reset(variation)
            assert ("take coin" in info["valid_actions"]) == first
            if first:
                assert env.step("take coin").score == 100


def test_search_on_seen_and_unseen_games_counts_only_the_games_that_need_exploring(tmp_path):
    """Searching against route-learning, on hand-made CoinCollector runs of two seeds: the training share counts the
    tip-free episodes of the last 20 iterations on training games whose coin is not in the first room, the test
    share the last evaluation's such test games, each the mean over the seeds of each seed's share."""
    import numpy as np
    import scipy.stats

    from empo2.analysis.lessons import searching_on_seen_and_unseen_games
    from tests.test_known_differences import episode, write_run

    cfg = EMPO2Config.from_profile("laptop", env="textworld_express", task="coin", method="empo2",
                                   n_train_variations=8, n_test_variations=8, results_dir=str(tmp_path))
    # Where the coin lies, read off the room each game starts in: its description names the coin there.
    with TextWorldExpressGame("coin", game_params=cfg.game_params, n_train_variations=8, n_test_variations=8) as env:
        in_first_room = {v: "coin" in env.reset(v)[0] for v in [*env.train_variations, *env.test_variations]}
        train_games, test_games = list(env.train_variations), list(env.test_variations)
    explore_train = [v for v in train_games if not in_first_room[v]]
    explore_test = [v for v in test_games if not in_first_room[v]]
    first_room_train = [v for v in train_games if in_first_room[v]]
    assert len(explore_train) >= 3 and first_room_train and len(explore_test) >= 3 and len(explore_test) < 8

    took = {0: [True, True, True, False], 1: [True, False, True, False, False]}  # the counted training episodes
    took_in_test = {0: 2, 1: 1}  # of the test games that need exploring, the first this many
    rows_of = {}
    for seed in (0, 1):
        rows = [episode(41 + i, "train", 100 if won else 0, variation=explore_train[i % len(explore_train)],
                        task="coin") for i, won in enumerate(took[seed])]
        rows += [  # none of these counts: a game with the coin in the first room, an episode with tips, too early
            episode(50, "train", 100, variation=first_room_train[0], task="coin"),
            episode(50, "train", 100, mode="memory_on", variation=explore_train[0], task="coin"),
            episode(40, "train", 100, variation=explore_train[0], task="coin"),
            *[episode(40, "eval", 100, variation=v, task="coin") for v in test_games]]
        rows += [episode(60, "eval", 100 if v not in explore_test or explore_test.index(v) < took_in_test[seed] else 0,
                         variation=v, task="coin") for v in test_games]
        rows_of[seed] = rows
    configs = [dataclasses.replace(cfg, seed=seed) for seed in (0, 1)]
    configs.append(dataclasses.replace(cfg, method="naive", seed=0))  # a method not asked for
    folders = [write_run(c.run_dir, c.to_dict(), rows_of[c.seed]) for c in configs]
    labels = {"grpo": "GRPO", "empo2": "EMPO²"}
    table = searching_on_seen_and_unseen_games(configs, folders, labels, last_iterations=20)
    assert list(table.index) == [("EMPO²", 8)]  # only the methods given, only runs of them
    row = table.loc[("EMPO²", 8)]
    # Training: seed 0 took the coin in 3 of 4 counted episodes, seed 1 in 2 of 5 (pooled: 5 of 9, 55.6 %).
    # Test: seed 0 in 2, seed 1 in 1 of the games that need exploring.
    training = [75.0, 40.0]
    test = [100 * took_in_test[seed] / len(explore_test) for seed in (0, 1)]
    for name, shares in (("training", training), ("test", test)):
        low, high = scipy.stats.ttest_1samp(shares, 0.0).confidence_interval(0.95)
        assert row[[f"{name} success %", f"{name} 95% low", f"{name} 95% high"]].tolist() == pytest.approx(
            [np.mean(shares), low, high])
    assert row["training episodes"] == 9 and row["test episodes"] == 2 * len(explore_test)
    assert row["training − test"] == pytest.approx(57.5 - np.mean(test))
