"""Out-of-distribution adaptation: a trained policy, a new task, trials with memory, no weight updates.

Each trial plays a group of memory-augmented episodes on one variation of the
new task; the policy writes a tip after each episode and the tips are stored, so
later trials can use what earlier ones learned. Weights never change.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from empo2.config import EMPO2Config
from empo2.envs import env_from_config
from empo2.episode import MEMORY_ON_POLICY
from empo2.llm.models import Embedder, load_policy, load_trained_weights
from empo2.method.memory import TipMemory
from empo2.method.rollout import Roller


def load_trained_policy(cfg: EMPO2Config, weights: Path | None):
    """The policy of `cfg` with the LoRA weights saved by a run (or the base model if `weights` is None)."""
    model, tokenizer = load_policy(cfg.model, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                                   lora_target_modules=cfg.lora_target_modules, device=cfg.device)
    if weights is not None:
        load_trained_weights(model, weights)
    model.requires_grad_(False)
    return model, tokenizer


def adapt(cfg: EMPO2Config, weights: Path | None, target_task: str, *, trials: int = 10,
          episodes_per_trial: int = 2, seed: int = 0, split: str = "test", index: int = 0) -> pd.DataFrame:
    """Scores of `trials` successive memory-augmented trials on `target_task`: one row per episode.

    Every trial plays the `index`-th variation of the task's `split` ("train" or "test"); tips are
    written as `cfg.tip_decoding` says and stored after each trial, in one memory for the task."""
    model, tokenizer = load_trained_policy(cfg, weights)
    embedder = Embedder(cfg.embedder)
    memory = TipMemory.from_config(cfg, embedder.dim)
    envs = [env_from_config(cfg, target_task) for _ in range(episodes_per_trial)]
    roller = Roller.from_config(cfg, model, tokenizer, embedder=embedder, memory=memory,
                                sampling_rng=torch.Generator().manual_seed(seed), memory_scope="task")
    rows = []
    try:
        variations = list(envs[0].train_variations if split == "train" else envs[0].test_variations)
        variation = variations[index % len(variations)]
        for trial in range(1, trials + 1):
            episodes = roller.run(envs, [variation] * episodes_per_trial, [MEMORY_ON_POLICY] * episodes_per_trial,
                                  temperature=cfg.temperature, write_tips=True)
            roller.store_tips(episodes)
            for episode in episodes:
                rows.append({"trial": trial, "variation": int(variation), "score": episode.score, "tip": episode.tip,
                             "tip_cut": episode.tip_cut,
                             "tips_shown": sum(len(t.tips_shown) for t in episode.turns),
                             "actions": [t.executed_action for t in episode.turns]})
    finally:
        for env in envs:
            env.close()
    return pd.DataFrame(rows)


COMMAND_WORDS = frozenset("""a an the to at on in into from of with and or go look pick up put move open close
    focus connect disconnect activate deactivate use read wait inventory around teleport pour mix eat flush
    drop dunk door""".split())
"""Words of an action that name no object: verbs, prepositions, articles (and `door`, in every room)."""


def names_its_episode(tip: str, actions: list[str]) -> bool:
    """Whether `tip` names an action its episode took, or an object one of those actions acted on."""
    text = " ".join(tip.lower().split())
    if any(action and action.lower() in text for action in actions):
        return True
    objects = {w for action in actions for w in action.lower().split() if w.isalpha() and w not in COMMAND_WORDS}
    words = set("".join(c if c.isalpha() else " " for c in text).split())
    return bool(objects & words)
