"""The suite defines each notebook's runs once, at the profile as it is."""

from empo2 import suite
from empo2.config import EMPO2Config
from empo2.notebooks import ROOT


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
