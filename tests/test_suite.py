"""The suite defines each notebook's runs once, at the profile as it is."""

from empo2.analysis import suite
from empo2.analysis.notebooks import ROOT
from empo2.config import EMPO2Config


def test_every_run_a_laptop_notebook_reads_is_committed():
    """On a fresh clone `make run` reuses every laptop run instead of training one."""
    assert suite.unfinished("laptop", str(ROOT / "results")) == []


def test_every_laptop_run_takes_the_laptop_profile_as_it_is():
    profile = EMPO2Config.from_profile("laptop", task=suite.MAIN_TASK)
    runs = suite.main_comparison("laptop") + suite.baselines("laptop")
    assert {c.method for c in runs} == {"naive", "memory_only", "grpo", "empo2"}
    for cfg in runs:
        assert (cfg.repeat_tips, cfg.action_decoding, cfg.tip_decoding) == (False, "constrained", "constrained")
        trained = cfg.method != "naive"
        assert cfg.iterations == (suite.MAIN_BUDGET["laptop"]["iterations"] if trained else profile.iterations)
    reference = suite.reference_run("laptop")
    assert suite.mode_ablation("laptop")["EMPO2 (full)"] == [reference] == suite.pq_sweep("laptop")["p=0.25"]
    assert suite.intrinsic_sweep("laptop")["1.0x"] == [reference]
    assert reference.iterations == profile.iterations
    assert suite.main_run("laptop", "empo2").experiment == "power-component"
    for group in suite.GROUPS:
        for cfg in suite.group_configs(group, "laptop"):
            assert (cfg.profile, cfg.action_decoding) == ("laptop", "constrained"), (group, cfg.name)


def test_each_training_temperature_run_names_the_policy_it_tests_once_per_seed():
    runs = suite.training_temperature("laptop")
    tested = sorted((cfg.seed, suite.policy_tested(cfg)) for cfg in runs)
    assert tested == sorted((seed, policy) for seed in suite.SEEDS["laptop"] for policy in ("untrained", "grpo", "empo2"))
    sources = {suite.policy_tested(cfg): cfg.init_weights for cfg in runs if cfg.seed == 1}
    assert sources["untrained"] == "" and sources["grpo"] == "power-component/grpo-power-component-seed1"


def test_the_coin_study_plan_is_fresh_balanced_and_its_contrasts_are_contrasts():
    """Seeds no CoinCollector run used, each arm's a prefix of the fresh ones (so that a study stopped part-way is
    balanced), trained seed by seed; the laptop CoinCollector budget; every contrast's weights sum to 0 and name
    planned arms; a slope's weights give the slope of arm means that lie on a line."""
    import numpy as np

    used = {cfg.seed for cfg in suite.coin_runs("laptop") + suite.coin_few_games("laptop")}
    assert not used & set(suite.FRESH_SEEDS) and len(suite.FRESH_SEEDS) == 10
    runs = suite.coin_study("laptop")
    profile = EMPO2Config.from_profile("laptop", env="textworld_express", task="coin")
    for arm in suite.COIN_STUDY_ARMS:
        assert arm.seeds == suite.FRESH_SEEDS[: len(arm.seeds)] and len(runs[arm.label]) == len(arm.seeds)
        for cfg in runs[arm.label]:
            assert (cfg.experiment, cfg.iterations, cfg.n_train_variations, cfg.game_params) == (
                "coin-study", profile.iterations, profile.n_train_variations, profile.game_params)
    folders = [cfg.run_dir for configs in runs.values() for cfg in configs]
    assert len(set(folders)) == len(folders) == 60
    order = suite.coin_study_order("laptop")
    assert [cfg.seed for cfg in order] == sorted(cfg.seed for cfg in order)
    assert sorted(cfg.run_dir for cfg in order) == sorted(folders)
    assert {cfg.n_test_variations for configs in suite.coin_study_tests("laptop").values() for cfg in configs} == {200}
    for contrast in suite.COIN_STUDY_CONTRASTS:
        assert set(contrast.weights) <= set(runs) and abs(sum(contrast.weights.values())) < 1e-12, contrast.name
    slope = next(c for c in suite.COIN_STUDY_CONTRASTS if c.name.startswith("q trend"))
    line = {"q = 0 (no off-policy updates)": 0.0, "q = 0.3": 0.3, "EMPO²": 2 / 3, "q = 0.95": 0.95,
            "q = 1 (off-policy updates only)": 1.0}
    assert np.isclose(sum(w * (5 + 3 * line[label]) for label, w in slope.weights.items()), 3.0)


def test_the_coin_studys_contrasts_find_known_differences():
    """Hand-made measures: EMPO² 16 points above GRPO, memory worth 10 and novelty 6 over the 2 × 2 (no
    interaction); the contrasts find those numbers, with intervals that hold them and, with 10 and 5 seeds of
    little noise, p < 0.05; an arm with fewer than 2 seeds leaves its contrasts waiting."""
    import numpy as np

    from empo2.analysis import study

    rng = np.random.default_rng(0)
    means = {"EMPO²": 60, "GRPO": 44, "GRPO with the novelty bonus": 50, "EMPO² without the novelty bonus": 54}
    seeds = {"EMPO²": 10, "GRPO": 10, "GRPO with the novelty bonus": 5, "EMPO² without the novelty bonus": 5}
    test = {label: [np.full(200, float(m)) + rng.normal(0, 1, 200) for _ in range(seeds[label])]
            for label, m in means.items()}
    test["q = 0 (no off-policy updates)"] = [np.full(200, 60.0)]  # one seed: waiting
    table = study.contrasts({"test": test, "entropy": {}})
    expected = {"EMPO² − GRPO (primary)": 16, "memory, main effect": 10, "novelty bonus, main effect": 6,
                "memory × novelty, interaction": 0}
    for name, value in expected.items():
        row = table.loc[name]
        assert abs(row["estimate"] - value) < 0.1 and row["95% low"] < value < row["95% high"], name
        assert (row["p"] < 0.05) == (value != 0), name
    assert table.loc["EMPO² − GRPO (primary)", "verdict"] == "reproduced"
    assert table.loc["off-policy updates: full − (q = 0)", "verdict"] == "waiting for runs"
    assert table.loc["novelty bonus and the policy's entropy, main effect", "verdict"] == "waiting for runs"
