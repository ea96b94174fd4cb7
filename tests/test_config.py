"""Every config field that can be out of range is rejected with a message naming it."""

import os
import subprocess
import sys

import pytest

from empo2.config import PROFILES, EMPO2Config

INVALID = [
    ("method", "ppo", "method: 'ppo' is not allowed; choose one of empo2, grpo, naive, memory_only"),
    ("profile", "huge", "profile"),
    ("env", "alfworld", "env"),
    ("mode_granularity", "step", "mode_granularity"),
    ("memory_scope", "global", "memory_scope"),
    ("delta_mode", "turn", "delta_mode"),
    ("device", "tpu", "device"),
    ("rollout_engine", "sglang", "rollout_engine: 'sglang' is not allowed; choose one of transformers, vllm"),
    ("vllm_constraint", "grammar", "vllm_constraint"),
    ("vllm_weight_sync", "lora", "vllm_weight_sync: 'lora' is not allowed; choose one of adapter, weights"),
    ("vllm_gpu_memory", 0.0, "vllm_gpu_memory"),
    ("vllm_cpu_kv_cache_gib", 0.0, "vllm_cpu_kv_cache_gib"),
    ("p", 1.5, r"p: 1.5 is out of range; allowed \[0.0, 1.0\]"),
    ("p", -0.1, "p:"),
    ("q", 2.0, "q:"),
    ("similarity_threshold", 1.2, "similarity_threshold"),
    ("novelty_threshold", -2.0, "novelty_threshold"),
    ("clip_low", 1.5, "clip_low"),
    ("delta", 1.5, "delta"),
    ("group_size", 1, "group_size: 1 is not allowed; need an integer >= 2"),
    ("group_size", 2.5, "group_size"),
    ("groups_per_iteration", 0, "groups_per_iteration"),
    ("n_train_variations", 0, "n_train_variations"),
    ("n_test_variations", 0, "n_test_variations"),
    ("response_tokens", 0, "response_tokens"),
    ("tip_tokens", 0, "tip_tokens"),
    ("memory_capacity", 0, "memory_capacity"),
    ("top_k", 0, "top_k"),
    ("ppo_epochs", 0, "ppo_epochs"),
    ("iterations", -1, "iterations"),
    ("eval_every", 0, "eval_every"),
    ("max_steps", -1, "max_steps"),
    ("lora_rank", -1, "lora_rank"),
    ("lora_alpha", 0, "lora_alpha"),
    ("minibatch_episodes", -1, "minibatch_episodes"),
    ("eval_variations", -1, "eval_variations"),
    ("checkpoint_every", -1, "checkpoint_every"),
    ("seed", -1, "seed"),
    ("lr", 0.0, "lr"),
    ("clip_high", 0.0, "clip_high"),
    ("max_grad_norm", 0.0, "max_grad_norm"),
    ("temperature", -1.0, "temperature"),
    ("eval_temperature", -0.5, "eval_temperature"),
    ("intrinsic_coef", -1.0, "intrinsic_coef"),
    ("kl_beta", -0.1, "kl_beta"),
    ("dual_clip", 1.0, "dual_clip"),
    ("eval_variations", 50, "eval_variations: 50 is not allowed; need <= n_test_variations"),
    ("lora_target_modules", (), "lora_target_modules"),
    ("lr", "abc", "lr: 'abc' is not allowed; need a number"),
    ("reuse_cache", 1, "reuse_cache: 1 is not allowed; need true or false"),
    ("task", "power-components", "task: 'power-components' is not a ScienceWorld task; choose one of boil, "),
    ("seed", True, "seed: True is not allowed; need an integer"),
]


@pytest.mark.parametrize("field,value,message", INVALID, ids=[f"{f}={v}" for f, v, _ in INVALID])
def test_invalid_field_is_rejected_with_its_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        EMPO2Config(**{field: value})


def test_unknown_field_and_profile_errors():
    with pytest.raises(ValueError, match="unknown config field.*learning_rate"):
        EMPO2Config.from_profile("ci", learning_rate=0.1)
    with pytest.raises(ValueError, match="profile: 'gpu' is not allowed"):
        EMPO2Config.from_profile("gpu")


@pytest.mark.parametrize("profile", PROFILES)
def test_profiles_are_valid_and_round_trip(profile):
    cfg = EMPO2Config.from_profile(profile)
    assert cfg.profile == profile
    assert EMPO2Config.from_dict(cfg.to_dict()) == cfg


def test_paper_profile_matches_method_defaults():
    cfg = EMPO2Config.from_profile("paper")
    assert (cfg.p, cfg.q, cfg.group_size, cfg.groups_per_iteration) == (0.25, 2 / 3, 8, 16)
    assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip, cfg.lr, cfg.kl_beta) == (0.2, 0.3, 10.0, 1e-6, 0.0)
    assert (cfg.temperature, cfg.eval_temperature, cfg.response_tokens) == (1.0, 0.4, 32)
    assert (cfg.memory_capacity, cfg.similarity_threshold, cfg.top_k) == (1000, 0.5, 10)
    assert cfg.model == "Qwen/Qwen2.5-7B-Instruct"
    webshop = EMPO2Config.from_profile("paper", env="webshop")
    assert (webshop.max_steps, webshop.response_tokens, webshop.kl_beta) == (15, 512, 0.01)


def test_methods_are_configurations_of_one_trainer():
    grpo = EMPO2Config(method="grpo", p=0.5)
    assert grpo.rollout_p == 0 and not grpo.writes_tips and not grpo.uses_novelty and grpo.trains_weights
    naive = EMPO2Config(method="naive")
    assert not naive.trains_weights and naive.rollout_p == 0
    memory_only = EMPO2Config(method="memory_only")
    assert memory_only.rollout_p == 1 and memory_only.writes_tips and not memory_only.trains_weights
    assert memory_only.eval_with_memory and not EMPO2Config().eval_with_memory


def test_every_field_has_help():
    from dataclasses import fields

    helps = EMPO2Config.help()
    assert {f.name for f in fields(EMPO2Config)} == set(helps)


def test_command_line_errors_are_one_line_before_anything_starts():
    """Bad --set values, tasks, model paths and EMPO2_DTYPE end in one line naming the field (no model load,
    no JVM)."""
    for arguments, variables, message in (
            (["--set", "lr=abc"], {}, "error: lr: 'abc' is not allowed; need a number"),
            (["--task", "power-components"], {}, "error: task: 'power-components' is not a"),
            (["--set", "model=no-such-org/no-such-model"], {}, "error: model: policy model"),
            (["--set", "reuse_cache=maybe"], {}, "error: reuse_cache: 'maybe' is not allowed"),
            ([], {"EMPO2_DTYPE": "fp16"}, "error: EMPO2_DTYPE: 'fp16' is not allowed; allowed:")):
        done = subprocess.run([sys.executable, "-m", "empo2", "train", "--profile", "ci", *arguments],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", **variables})
        assert done.returncode != 0
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), done.stderr[-500:]
