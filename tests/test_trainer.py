"""The trainer end to end on the toy corridor (fast): weights change, files are complete, resume is exact."""

import json
import math

import pytest
import torch

from empo2.config import EMPO2Config
from empo2.llm.logprobs import episode_logprobs
from empo2.method.memory import TipMemory
from empo2.method.trainer import Trainer

TIMING_PREFIX = "time/"


def _cfg(tmp_path, **overrides):
    values = dict(env="corridor", experiment="test", results_dir=str(tmp_path), max_steps=3, response_tokens=8,
                  tip_tokens=8, p=0.5, iterations=2, eval_every=2, checkpoint_every=1, n_test_variations=2,
                  eval_variations=1, lr=1e-3)
    values.update(overrides)
    return EMPO2Config.from_profile("ci", **values)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _without_timings(row):
    return {k: v for k, v in row.items() if not k.startswith(TIMING_PREFIX)}


def test_training_changes_lora_weights_and_writes_a_complete_results_folder(tmp_path):
    cfg = _cfg(tmp_path, iterations=1, eval_every=1, p=0.0, intrinsic_coef=1.0)
    with Trainer(cfg, show_progress=False) as trainer:
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        assert before and all("lora_" in n for n in before)
        metrics = trainer.train()
        after = dict(trainer.model.named_parameters())
    changed = [n for n, value in before.items() if not torch.equal(value, after[n].detach())]
    assert "update/skipped" not in metrics  # the intrinsic reward separates the group's returns
    assert len(changed) == len(before), "every LoRA tensor receives a gradient (lora_B starts at zero)"
    assert math.isfinite(metrics["update/loss"])
    run = cfg.run_dir
    saved = json.loads((run / "config.json").read_text())
    assert saved["config"]["method"] == "empo2" and len(saved["git_commit"]) == 40
    assert {"torch", "transformers", "peft", "numpy"} <= set(saved["packages"])
    assert len(_rows(run / "metrics.jsonl")) == 1 and "eval/score" in _rows(run / "metrics.jsonl")[0]
    episodes = _rows(run / "episodes.jsonl")
    assert {row["phase"] for row in episodes} == {"train", "eval"}
    assert len([r for r in episodes if r["phase"] == "train"]) == cfg.group_size
    assert len(_rows(run / "tips.jsonl")) == cfg.group_size
    assert (run / "checkpoints" / "latest").exists()


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    straight_cfg = _cfg(tmp_path, run_name="straight")
    with Trainer(straight_cfg, show_progress=False) as trainer:
        trainer.train()
        straight_weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    with Trainer(_cfg(tmp_path, run_name="resumed"), show_progress=False) as trainer:
        trainer.train(stop_after=1)  # as if the process died here
    with Trainer(_cfg(tmp_path, run_name="resumed"), resume=True, show_progress=False) as trainer:
        assert trainer.iteration == 1
        trainer.train()
        resumed_weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}

    straight, resumed = straight_cfg.run_dir, straight_cfg.run_dir.with_name("resumed")
    assert [_without_timings(r) for r in _rows(straight / "metrics.jsonl")] == [
        _without_timings(r) for r in _rows(resumed / "metrics.jsonl")]
    assert _rows(straight / "episodes.jsonl") == _rows(resumed / "episodes.jsonl")
    for name, value in straight_weights.items():
        assert torch.equal(value, resumed_weights[name]), name
    memory_a = TipMemory.load(straight / "checkpoints" / "iter-00002" / "memory")
    memory_b = TipMemory.load(resumed / "checkpoints" / "iter-00002" / "memory")
    assert [(e.content, e.score, e.scope) for e in memory_a.entries()] == [
        (e.content, e.score, e.scope) for e in memory_b.entries()]
    assert len(memory_a) > 0


def test_naive_and_memory_only_do_not_touch_weights(tmp_path):
    for method in ("naive", "memory_only"):
        cfg = _cfg(tmp_path, method=method, iterations=1, eval_every=1)
        with Trainer(cfg, show_progress=False) as trainer:
            assert trainer.update is None
            metrics = trainer.train()
        assert "eval/score" in metrics
        if method == "memory_only":
            assert metrics["memory/size"] > 0 and metrics["train/episodes/plain"] == 0


def test_a_trained_runs_weights_evaluated_again_play_its_final_evaluation(tmp_path):
    """init_weights with method naive evaluates a finished run's policy: greedy, it replays that run's final
    evaluation exactly (the way notebook 04 tests trained weights at another temperature)."""
    trained = _cfg(tmp_path, p=0.0, eval_temperature=0.0, intrinsic_coef=1.0, checkpoint_every=0)
    with Trainer(trained, show_progress=False) as trainer:
        trainer.train()
    saved = torch.load(trained.run_dir / "final_weights.pt")
    assert any(value.abs().sum() > 0 for name, value in saved.items() if "lora_B" in name)

    again = _cfg(tmp_path, method="naive", eval_temperature=0.0, init_weights=f"test/{trained.name}",
                 run_name="again")
    with Trainer(again, show_progress=False) as trainer:
        loaded = dict(trainer.model.named_parameters())
        assert all(torch.equal(loaded[name], value) for name, value in saved.items())
        trainer.train()
    final = [r for r in _rows(trained.run_dir / "episodes.jsonl")
             if r["phase"] == "eval" and r["iteration"] == trained.iterations]
    replayed = _rows(again.run_dir / "episodes.jsonl")
    assert [(r["actions"], r["score"]) for r in replayed] == [(r["actions"], r["score"]) for r in final]


def test_init_weights_naming_no_finished_run_is_refused_before_anything_is_written(tmp_path):
    cfg = _cfg(tmp_path, method="naive", init_weights="test/no-such-run")
    with pytest.raises(ValueError, match="init_weights: 'test/no-such-run'"):
        Trainer(cfg, show_progress=False)
    assert not (tmp_path / "ci").exists()


def test_full_finetuning_keeps_float32_master_weights(tmp_path):
    cfg = _cfg(tmp_path, lora_rank=0, iterations=1, eval_every=1, checkpoint_every=0, lr=1e-5, run_name="full",
               intrinsic_coef=1.0)
    with Trainer(cfg, show_progress=False) as trainer:
        assert not hasattr(trainer.model, "disable_adapter")
        assert all(p.dtype == torch.float32 for p in trainer.update.trainable)
        embedding = trainer.model.get_input_embeddings().weight
        before = embedding.detach().clone()
        metrics = trainer.train()
        assert "update/skipped" not in metrics
        assert not torch.equal(before, embedding.detach())
        assert math.isfinite(metrics["update/loss"])


def test_old_logprobs_taken_from_the_first_gradient_pass_equal_a_separate_pass(tmp_path):
    """Before the first optimiser step θ_old = θ, so θ_old's log-probs are taken from each episode's first gradient
    pass: the update reads no pass without gradient, and what the second epoch's loss reads as θ_old equals a
    separate no-grad pass over the episodes made before the update."""
    cfg = _cfg(tmp_path, iterations=1, eval_every=100, p=0.0, intrinsic_coef=1.0, minibatch_episodes=0, ppo_epochs=2)
    separate = {}  # id(episode) -> (T,) θ_old log-probs of a pass of their own
    old_read = []  # (id(episode), the θ_old log-probs its loss read; None: this pass's own), pass after pass
    with Trainer(cfg, show_progress=False) as trainer:
        update = trainer.update
        token_batches, backward = update.token_batches, update.backward

        def scored_apart_first(episodes, *args):
            with torch.no_grad(), update.precision():
                for e in episodes:
                    separate[id(e)] = episode_logprobs(trainer.model, e, with_tips=e.sampled_with_tips,
                                                       packed=cfg.packed_logprobs, temperature=cfg.temperature)
            return token_batches(episodes, *args)

        def recorded(episode, batch, normalizer):
            old_read.append((id(episode), None if batch.old_logprobs is None else batch.old_logprobs.clone()))
            return backward(episode, batch, normalizer)

        update.token_batches, update.backward = scored_apart_first, recorded
        metrics = trainer.train_iteration()
    assert "update/skipped" not in metrics  # the intrinsic reward separates the returns
    assert metrics["update/tokens_read_without_gradient"] == 0.0
    assert metrics["update/tokens_read_per_trajectory_token"] == 2.0  # the two epochs' gradient passes alone
    half = len(old_read) // 2
    first, second = old_read[:half], old_read[half:]
    assert first and all(old is None for _, old in first)
    assert sorted(episode for episode, _ in first) == sorted(episode for episode, _ in second)
    for episode, old in second:
        torch.testing.assert_close(old, separate[episode].float(), atol=1e-4, rtol=0)
