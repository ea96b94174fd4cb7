"""Text environments: ScienceWorld (the paper's main benchmark), WebShop, and a toy corridor."""

from __future__ import annotations

import os

from empo2.envs.base import StepResult, TextEnv, snap_action

ENV_NAMES = ("scienceworld", "webshop", "corridor")


def make_env(name: str, task: str | None = None, **kwargs) -> TextEnv:
    """Build one environment instance by name.

    `task` is the ScienceWorld task name (e.g. "power-component"); WebShop and the
    corridor have a single task and ignore it. Extra keyword arguments go to the
    environment's constructor.
    """
    if name == "scienceworld":
        from empo2.envs.scienceworld import ScienceWorldTask

        return ScienceWorldTask(task or "power-component", **kwargs)
    if name == "webshop":
        from empo2.envs.webshop import WebShopEnv

        return WebShopEnv(**kwargs)
    if name == "corridor":
        from empo2.envs.toy import CorridorEnv

        return CorridorEnv(**kwargs)
    raise ValueError(f"env: unknown environment {name!r}; allowed: {', '.join(ENV_NAMES)}")


def env_from_config(cfg, task: str | None = None) -> TextEnv:
    """One environment instance as an `EMPO2Config` describes it (`task` replaces the config's, e.g. for adaptation)."""
    kwargs = {}
    if cfg.max_steps:
        kwargs["max_steps"] = cfg.max_steps
    if cfg.env == "scienceworld":
        kwargs.update(n_train_variations=cfg.n_train_variations, n_test_variations=cfg.n_test_variations,
                      jvm_heap=cfg.jvm_heap)
    if cfg.env == "webshop":
        # Small policies rarely write exact click[...] syntax; snap unparsable text to the
        # most similar admissible click, as free text is snapped in ScienceWorld.
        kwargs.update(snap_actions=True, goal_source=cfg.webshop_goals)
        for field, name in (("webshop_products", "products_path"), ("webshop_instructions", "instructions_path"),
                            ("webshop_human_goals", "human_goals_path")):
            if getattr(cfg, field):
                kwargs[name] = os.path.expanduser(getattr(cfg, field))
    return make_env(cfg.env, task or cfg.task, **kwargs)


__all__ = ["ENV_NAMES", "StepResult", "TextEnv", "env_from_config", "make_env", "snap_action"]
