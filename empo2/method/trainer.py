"""The EMPO² trainer. GRPO is the same trainer with p = 0.

One iteration, top to bottom (`Trainer.train_iteration`, one call per step):

    1. draw_groups     `groups_per_iteration` training variations of the task, and each rollout's mode
                       (memory with prob. p; off-policy with prob. q)               (empo2.method.rollout.draw_modes)
    2. play_groups     per variation, a group of `group_size` episodes in lock-step  (empo2.method.rollout)
    3.                 the policy writes one tip per episode                          (Roller.run, write_tips)
    4.                 return = final score + intrinsic novelty reward; GRPO advantages within
                       each group                                                     (empo2.method.advantages)
    5. remember        after all groups, the tips go to memory and the visited states to the
                       novelty store, in group order                                  (empo2.method.memory, empo2.method.novelty)
    6. update_policy   θ_old log-probs with tips where shown, then `ppo_epochs` passes of clipped updates
                       where each mode scores its actions in its own context: plain / with tips /
                       tip-free                                                       (empo2.method.update, empo2.method.loss)
    7. evaluate        every `eval_every` iterations, WITHOUT memory on test variations (`Trainer.train`)

Launched as several processes (torchrun / accelerate launch), each plays its share of the groups
and the update sums their gradients: the same run as one process (empo2.method.distributed).

Everything a run produces lands in `results/<profile>/<experiment>/<run>/` (`cfg.run_dir`, empo2.runs):
    config.json       the config, git commit, package versions, machine
    metrics.jsonl     one row per iteration (training and, when run, evaluation)
    episodes.jsonl    one row per episode (train and eval): mode, score, actions, tip
    tips.jsonl        every tip written, with its episode's score
    summary.json      the last metrics, once the run finished; final_weights.pt beside it
    evaluations/      `evaluate_run`'s evaluations of the run, eval-NNN/ each
    checkpoints/      resumable state every `checkpoint_every` iterations (git-ignored)
A folder that already holds a run is resumed or replaced only when asked (`resume`, `overwrite`).
"""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from empo2.config import EMPO2Config
from empo2.envs import env_from_config
from empo2.episode import MEMORY_ON_POLICY, MODE_NAMES, PLAIN, Episode, Mode
from empo2.llm.logprobs import context_tokens
from empo2.llm.models import Embedder, default_dtype, load_policy, load_trained_weights
from empo2.method.advantages import grpo_advantages
from empo2.method.distributed import Processes, group_seed
from empo2.method.memory import TipMemory
from empo2.method.novelty import GroupNovelty, NoveltyStore, replay
from empo2.method.rollout import Roller, RolloutTimer, draw_modes
from empo2.method.update import PolicyUpdate
from empo2.runs import FINAL_WEIGHTS, RunError, RunFolder, provenance, read_rows
from empo2.stats import bootstrap_interval


@dataclass
class PlayedGroup:
    """What one group left after its rollouts: what the update, the memory, the novelty store and the records
    need (small and picklable: processes exchange them)."""
    advantages: torch.Tensor  # (group_size,) GRPO advantages of score + intrinsic reward
    decisions: list[int]  # per episode: its sampled (not forced) action tokens
    rows: list[dict]  # per episode: its row of episodes.jsonl
    tips: tuple | None  # (keys, contents, scores, scopes) for `TipMemory.add_many`; None when no tips are written
    visits: list  # the novelty store's visits, replayed into the shared store in group order


class Trainer:
    """Builds everything a run needs from an `EMPO2Config`; `train()` runs it.

    resume: continue the run in `cfg.run_dir` from its last checkpoint; overwrite: delete what that folder
    holds and start afresh. Without either, a folder that holds a run is refused (`RunExists`) before
    anything slow starts. `folder` writes the records elsewhere and `weights` starts from a weights file
    (`evaluate_run` uses both).
    """

    def __init__(self, cfg: EMPO2Config, *, resume: bool = False, overwrite: bool = False, show_progress: bool = True,
                 folder: Path | None = None, weights: Path | None = None):
        self.cfg = cfg
        initial_weights = weights
        if initial_weights is None and cfg.init_weights:
            initial_weights = Path(cfg.results_dir) / cfg.profile / cfg.init_weights / FINAL_WEIGHTS
            if not initial_weights.is_file():
                raise ValueError(f"init_weights: {cfg.init_weights!r} has no {FINAL_WEIGHTS} under "
                                 f"{Path(cfg.results_dir) / cfg.profile}; name a finished run as experiment/run_name")
        self.processes = Processes(cfg.device)
        self.show_progress = show_progress and self.processes.is_main
        self.folder = RunFolder(folder or cfg.run_dir, writes=self.processes.is_main)
        self.run_dir = self.folder.path
        checkpoint = self.folder.claim(cfg, resume=resume, overwrite=overwrite)  # may refuse: before anything slow
        self.processes.wait()  # every process has read the folder before the first one writes into it
        self.iteration = 0
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self.sampling_rng = torch.Generator().manual_seed(cfg.seed)

        self.envs = self.environments()  # before the model: a game that cannot start stops the run sooner
        self.train_variations = list(self.envs[0].train_variations)[: cfg.n_train_variations]
        self.test_variations = list(self.envs[0].test_variations)[: cfg.eval_variations or cfg.n_test_variations]
        self.full_finetune = cfg.trains_weights and cfg.lora_rank == 0
        self.model, self.tokenizer = load_policy(
            cfg.model, lora_rank=cfg.lora_rank if cfg.trains_weights or initial_weights else 0, lora_alpha=cfg.lora_alpha,
            lora_target_modules=cfg.lora_target_modules, device=self.processes.device,
            # Full fine-tuning keeps float32 master weights and runs the maths in bf16 autocast.
            dtype=torch.float32 if self.full_finetune else None,
        )
        if initial_weights is not None:
            load_trained_weights(self.model, initial_weights)
        if not cfg.trains_weights:
            self.model.requires_grad_(False)
        self.update = (PolicyUpdate(self.model, cfg, self.rng, self.precision, self.processes)
                       if cfg.trains_weights else None)

        needs_embedder = cfg.rollout_p > 0 or cfg.writes_tips or cfg.uses_novelty
        self.embedder = Embedder(cfg.embedder) if needs_embedder else None
        dim = self.embedder.dim if self.embedder else 384
        self.memory = TipMemory.from_config(cfg, dim)
        self.novelty = NoveltyStore(dim=dim, similarity_threshold=cfg.novelty_threshold,
                                    coefficient=cfg.intrinsic_coef)
        self.roller = Roller.from_config(cfg, self.model, self.tokenizer, embedder=self.embedder, memory=self.memory,
                                         novelty=self.novelty, sampling_rng=self.sampling_rng)
        # The weights' dtype follows the machine (models.default_dtype), not the config: saved beside it.
        self.folder.start({"config": cfg.to_dict(), **provenance(), "policy_dtype": str(self.model.dtype)},
                          fresh=checkpoint is None)
        if checkpoint is not None:
            self.load_checkpoint(checkpoint)

    def environments(self) -> list:
        """The group's environments. The config's split sizes were checked where they are known without an
        environment; here the rest (WebShop's depend on its data), before the folder is written, so that a run
        plays exactly what its config says. On any error no environment is left running."""
        cfg, envs = self.cfg, []
        try:
            for _ in range(cfg.group_size):
                envs.append(env_from_config(cfg))
            try:
                cfg.validate_split_sizes((len(envs[0].train_variations), len(envs[0].test_variations)))
            except ValueError as error:
                raise RunError(str(error)) from None
        except BaseException:
            for env in envs:
                env.close()
            raise
        return envs

    def precision(self):
        """bf16 autocast for full fine-tuning (float32 master weights) where bf16 is fast; LoRA runs need none."""
        if self.full_finetune and default_dtype(self.processes.device) == torch.bfloat16:
            return torch.autocast(device_type=self.processes.device.type, dtype=torch.bfloat16)
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
            self.folder.finish(last)
            return last
        started_at = self.iteration
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
        if self.iteration > started_at and (not cfg.checkpoint_every or self.iteration % cfg.checkpoint_every):
            self.save_checkpoint()
        if self.iteration == started_at:  # resumed at the end: its last row is the run's last metrics
            last = (read_rows(self.run_dir / "metrics.jsonl") or [{}])[-1]
        if self.iteration == cfg.iterations and not self.folder.finished:
            # Small (LoRA) final weights beside the results, for notebooks that reuse the trained policy.
            self.folder.finish(last, self.trainable_state() if self.update is not None else None)
        return last

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.model.named_parameters() if p.requires_grad}

    def train_iteration(self) -> dict:
        """One iteration, in order; returns its metrics."""
        started = time.perf_counter()
        self.roller.timer = RolloutTimer()  # per-iteration timings
        variations, modes = self.draw_groups()                 # 1. the groups' variations and modes
        groups, played = self.play_groups(variations, modes)   # 2-4. rollouts, tips, advantages (this process's)
        tips_added = self.remember(played)                     # 5. tips into memory, visits into novelty
        rollout_seconds = time.perf_counter() - started
        update_started = time.perf_counter()
        update_metrics = self.update_policy(groups, played)    # 6. the update
        self.iteration += 1
        rows = self.record(played)
        return {**self.iteration_metrics(rows, tips_added), "time/rollout": rollout_seconds,
                "time/update": time.perf_counter() - update_started, "time/iteration": time.perf_counter() - started,
                **self.roller.timer.as_dict(), **update_metrics}

    def draw_groups(self) -> tuple[np.ndarray, list[Mode]]:
        """The iteration's training variations (one per group) and every episode's mode, drawn on every process."""
        cfg = self.cfg
        replace = cfg.groups_per_iteration > len(self.train_variations)
        variations = self.rng.choice(self.train_variations, size=cfg.groups_per_iteration, replace=replace)
        modes = draw_modes(cfg.group_size * cfg.groups_per_iteration, cfg.rollout_p, cfg.rollout_q,
                           self.rng, per_iteration=cfg.mode_granularity == "iteration")
        return variations, modes

    def play_groups(self, variations: np.ndarray, modes: list[Mode]
                    ) -> tuple[dict[int, list[Episode]], dict[int, PlayedGroup]]:
        """Play this process's groups (each from its own seed, against the novelty store as of the iteration's
        start) and write their tips; their GRPO advantages on return = score + intrinsic reward. Returns the
        episodes by group, and every group's `PlayedGroup` gathered from all processes."""
        cfg = self.cfg
        groups, played = {}, {}
        mine = self.processes.mine(len(variations))
        bar = tqdm(total=cfg.group_size * len(mine), desc=f"iteration {self.iteration + 1} episodes",
                   leave=False, disable=not self.show_progress)
        for g in mine:
            self.sampling_rng.manual_seed(group_seed(cfg.seed, self.iteration, g))
            novelty = self.roller.novelty = GroupNovelty(self.novelty) if cfg.uses_novelty else None
            with self.precision():
                group = self.roller.run(
                    self.envs, [int(variations[g])] * cfg.group_size, modes[g * cfg.group_size:][: cfg.group_size],
                    temperature=cfg.temperature, write_tips=cfg.writes_tips, use_novelty=cfg.uses_novelty,
                    progress=bar,
                )
            advantages = grpo_advantages(torch.tensor([e.total_return for e in group]))  # (group_size,)
            groups[g] = group
            played[g] = PlayedGroup(
                advantages=advantages, decisions=[e.decision_count() for e in group],
                rows=[episode_row(e, self.iteration + 1, "train", float(a)) for e, a in zip(group, advantages)],
                tips=self.roller.tip_entries(group) if cfg.writes_tips else None,
                visits=novelty.visits if novelty else [])
        bar.close()
        self.roller.novelty = self.novelty
        return groups, self.processes.gather(played)

    def remember(self, played: dict[int, PlayedGroup]) -> int:
        """Every group's tips into the memory and its visited states into the novelty store, in group order
        (the same on every process). Returns the number of memory entries added."""
        started, added = time.perf_counter(), 0
        for g in sorted(played):
            if played[g].tips:
                added += self.memory.add_many(*played[g].tips)
            replay(played[g].visits, self.novelty)
        self.roller.timer.memory += time.perf_counter() - started
        return added

    def update_policy(self, groups: dict[int, list[Episode]], played: dict[int, PlayedGroup]) -> dict:
        """The update over the iteration's episodes in group order (None where another process played them)."""
        if self.update is None:
            return {}
        order = sorted(played)
        episodes = [e for g in order for e in groups.get(g, [None] * self.cfg.group_size)]
        advantages = torch.cat([played[g].advantages for g in order])  # (n_episodes,)
        return self.update(episodes, advantages, [n for g in order for n in played[g].decisions])

    def record(self, played: dict[int, PlayedGroup]) -> list[dict]:
        """Append the iteration's episodes and tips to the run's records; returns the episode rows."""
        rows = [row for g in sorted(played) for row in played[g].rows]
        self.folder.append("episodes.jsonl", rows)
        self.folder.append("tips.jsonl", [{"iteration": self.iteration, "variation": r["variation"], "mode": r["mode"],
                                           "score": r["score"], "tip": r["tip"], "tip_ids": r["tip_ids"],
                                           "tip_cut": r["tip_cut"]} for r in rows if r["tip"]])
        return rows

    def iteration_metrics(self, rows: list[dict], tips_added: int) -> dict:
        """Training scores overall and per mode, the policy's entropy at its decisions overall and per mode, the
        share of groups that carry a learning signal, the stores' sizes and the tokens played."""
        scores = np.array([r["score"] for r in rows])
        groups = [rows[start : start + self.cfg.group_size] for start in range(0, len(rows), self.cfg.group_size)]
        metrics = {
            "iteration": self.iteration,
            "train/score": float(scores.mean()),
            "train/score_std": float(scores.std()),
            "train/success": float(np.mean([r["success"] for r in rows])),
            "train/intrinsic": float(np.mean([r["intrinsic"] for r in rows])),
            "train/steps": float(np.mean([r["steps"] for r in rows])),
            "memory/size": len(self.memory),
            "memory/added": tips_added,
            "novelty/states": len(self.novelty),
            # A group whose advantages are all 0 gives no policy gradient: GRPO's skipped updates. With the
            # novelty bonus, returns differ where scores do not.
            "train/groups_with_signal": float(np.mean([any(r["advantage"] != 0 for r in g) for g in groups])),
            "train/groups_with_score_signal": float(np.mean([len({r["score"] for r in g}) > 1 for g in groups])),
            **token_totals(rows),
            **decision_entropy(rows, "train/entropy"),
        }
        for name in MODE_NAMES.values():
            chosen = [r for r in rows if r["mode"] == name]
            metrics[f"train/episodes/{name}"] = len(chosen)
            if chosen:
                metrics[f"train/score/{name}"] = float(np.mean([r["score"] for r in chosen]))
                metrics.update(decision_entropy(chosen, f"train/entropy/{name}"))
        return metrics

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict:
        """Score the policy on the test variations, WITHOUT memory (memory_only: with it)."""
        cfg = self.cfg
        started = time.perf_counter()
        mode = MEMORY_ON_POLICY if cfg.eval_with_memory else PLAIN
        variations = [v for v in self.test_variations for _ in range(cfg.eval_samples)]
        chunks = [variations[start : start + len(self.envs)] for start in range(0, len(variations), len(self.envs))]
        mine = self.processes.mine(len(chunks))
        rows = {}
        bar = tqdm(total=sum(len(chunks[c]) for c in mine), desc="evaluation", leave=False,
                   disable=not self.show_progress)
        for c in mine:
            self.sampling_rng.manual_seed(group_seed(cfg.seed, self.iteration, c, phase="eval"))
            with self.precision():
                episodes = self.roller.run(self.envs, chunks[c], [mode] * len(chunks[c]),
                                           temperature=cfg.eval_temperature, progress=bar)
            rows[c] = [episode_row(e, self.iteration, "eval") for e in episodes]
        bar.close()
        rows = self.processes.gather(rows)
        rows = [row for c in sorted(rows) for row in rows[c]]
        self.folder.append("episodes.jsonl", rows)
        scores = np.array([r["score"] for r in rows])
        low, high = bootstrap_interval(scores)
        return {"eval/score": float(scores.mean()), "eval/score_std": float(scores.std()),
                "eval/score_low": low, "eval/score_high": high,
                "eval/success": float(np.mean([r["success"] for r in rows])),
                "eval/episodes": len(rows), **token_totals(rows, prefix="eval/tokens"),
                **decision_entropy(rows, "eval/entropy"),
                "time/evaluation": time.perf_counter() - started}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path | None:
        """Everything needed to continue exactly: weights, optimizer, memory, novelty, every process's RNGs."""
        generators = self.processes.gather({self.processes.rank: {
            "python_random": random.getstate(),
            "numpy_global": np.random.get_state(),
            "numpy_rng": self.rng.bit_generator.state,
            "torch_global": torch.get_rng_state(),
            "sampler": self.sampling_rng.get_state(),
        }})
        optimizer = self.processes.optimizer_state(self.update.optimizer) if self.update is not None else None
        if self.processes.is_main:
            with self.folder.new_checkpoint(self.iteration) as partial:
                torch.save(self.trainable_state(), partial / "weights.pt")
                if optimizer is not None:
                    torch.save(optimizer, partial / "optimizer.pt")
                self.memory.save(partial / "memory")
                torch.save({"iteration": self.iteration, "novelty": self.novelty.state_dict(),
                            "processes": [generators[rank] for rank in sorted(generators)]}, partial / "state.pt")
        self.processes.wait()  # no process reads a checkpoint before it is complete
        return self.folder.latest_checkpoint()

    def load_checkpoint(self, path: Path) -> None:
        load_trained_weights(self.model, path / "weights.pt")
        if self.update is not None and (path / "optimizer.pt").exists():
            self.update.optimizer.load_state_dict(torch.load(path / "optimizer.pt"))
        self.memory = TipMemory.load(path / "memory")
        self.roller.memory = self.memory
        state = torch.load(path / "state.pt", weights_only=False)
        self.novelty.load_state_dict(state["novelty"])
        if len(state["processes"]) != self.processes.size:
            raise ValueError(f"checkpoint {path}: saved by {len(state['processes'])} processes; resume it with as many "
                             f"(this run has {self.processes.size})")
        generators = state["processes"][self.processes.rank]
        random.setstate(generators["python_random"])
        np.random.set_state(generators["numpy_global"])
        self.rng.bit_generator.state = generators["numpy_rng"]
        torch.set_rng_state(generators["torch_global"])
        self.sampling_rng.set_state(generators["sampler"])
        self.iteration = state["iteration"]
        self.folder.drop_rows_after(self.iteration)  # rows of a run that died after this checkpoint

    def close(self) -> None:
        for env in self.envs:
            env.close()
        if self.roller.engine is not None:
            self.roller.engine.close()
        self.processes.end()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def episode_row(episode, iteration: int, phase: str, advantage: float | None = None) -> dict:
    """One row of episodes.jsonl: what an episode did and scored, and the tokens it carried (`context_tokens`)."""
    return {
        "iteration": iteration, "phase": phase, "task": episode.task, "variation": episode.variation,
        "mode": episode.mode_name, "score": episode.score, "intrinsic": episode.intrinsic_return,
        "advantage": advantage, "steps": len(episode.turns), "success": episode.success,
        "truncated": episode.truncated, "env_restarts": episode.env_restarts,
        "actions": [turn.executed_action for turn in episode.turns],
        "raw_actions": [turn.raw_action for turn in episode.turns],
        "tips_shown": sum(len(turn.tips_shown) for turn in episode.turns), "tip": episode.tip,
        "tip_ids": episode.tip_ids, "tip_cut": episode.tip_cut, "tokens": context_tokens(episode),
        "decisions": episode.decision_count(), "entropy": episode.decision_entropy(),
    }


def decision_entropy(rows: list[dict], name: str) -> dict[str, float]:
    """{name: the mean entropy of the sampling distribution over every decision token of `rows`' episodes}, or {}
    where the sampler did not report it."""
    reported = [(r["entropy"], r["decisions"]) for r in rows if r["entropy"] is not None and r["decisions"]]
    if not reported:
        return {}
    return {name: float(sum(e * n for e, n in reported) / sum(n for _, n in reported))}


def token_totals(rows: list[dict], prefix: str = "tokens") -> dict[str, int]:
    """The tokens the episodes of `rows` carried in context, summed by kind (`logprobs.context_tokens`):
    "tokens/context", "tokens/prompt", "tokens/response", "tokens/tips", "tokens/tip_written"."""
    return {f"{prefix}/{kind}": sum(row["tokens"][kind] for row in rows) for kind in rows[0]["tokens"]} if rows else {}


def evaluate_run(cfg: EMPO2Config, *, show_progress: bool = True) -> tuple[dict, Path]:
    """Evaluate the run in `cfg.run_dir` again, into a new `evaluations/eval-NNN/` folder beside its records
    (which it only reads). Returns the evaluation's metrics (their "weights" says which policy played) and folder.

    The policy is the run's latest checkpoint, else its final_weights.pt (a clone has no checkpoints); a method
    that trains no weights plays its starting policy (memory_only with its checkpoint's memory, if any). The
    sampling seeds are those of the run's own evaluation after that iteration, so evaluating a finished run's
    final weights with its config replays its final evaluation.
    """
    source = RunFolder(cfg.run_dir, writes=False)
    if not (source.path / "config.json").exists():
        raise RunError(f"no run at {source.path} to evaluate; train it first (python -m empo2 train "
                       "with the same options)")
    checkpoint, final = source.latest_checkpoint(), source.path / FINAL_WEIGHTS
    weights = None
    if cfg.trains_weights:
        weights = checkpoint / "weights.pt" if checkpoint is not None else final if final.exists() else None
        if weights is None:
            raise RunError(f"{source.path} has neither a checkpoint nor {FINAL_WEIGHTS}: no trained weights "
                           "to evaluate")
    if checkpoint is not None:
        iteration = torch.load(checkpoint / "state.pt", weights_only=False)["iteration"]
    else:
        iteration = cfg.iterations if source.finished and cfg.method != "naive" else 0
    used = (f"{weights} (iteration {iteration})" if weights is not None
            else f"{cfg.init_weights}'s final weights" if cfg.init_weights else "the base model")
    if cfg.eval_with_memory:
        used += " with the memory of " + (str(checkpoint) if checkpoint is not None else "nothing (no checkpoint)")
    evaluations = source.path / "evaluations"
    number = 1 + max((int(p.name.split("-")[1]) for p in evaluations.glob("eval-[0-9][0-9][0-9]")), default=0)
    with Trainer(cfg, folder=evaluations / f"eval-{number:03d}", weights=weights,
                 show_progress=show_progress) as trainer:
        if cfg.eval_with_memory and checkpoint is not None:
            trainer.memory = trainer.roller.memory = TipMemory.load(checkpoint / "memory")
        trainer.iteration = iteration
        metrics = {"iteration": iteration, "weights": used, **trainer.evaluate()}
        trainer.folder.append("metrics.jsonl", [metrics])
        trainer.folder.finish(metrics)
        return metrics, trainer.run_dir
