"""Text environments: ScienceWorld (the paper's main benchmark), WebShop, TextWorldExpress (a fast text game), and a toy corridor."""

from __future__ import annotations

from empo2.envs.base import GameError, StepResult, TextEnv, snap_action

ENV_NAMES = ("scienceworld", "webshop", "textworld_express", "corridor")


def make_env(name: str, task: str | None = None, **kwargs) -> TextEnv:
    """Build one environment instance by name.

    `task` is the ScienceWorld task name (e.g. "power-component") or the TextWorldExpress game
    (e.g. "coin"); WebShop and the corridor have a single task and ignore it. Extra keyword arguments go to the
    environment's constructor.
    """
    if name == "scienceworld":
        from empo2.envs.scienceworld import ScienceWorldTask

        return ScienceWorldTask(task or "power-component", **kwargs)
    if name == "webshop":
        from empo2.envs.webshop import WebShopEnv

        return WebShopEnv(**kwargs)
    if name == "textworld_express":
        from empo2.envs.textworld_express import TextWorldExpressGame

        return TextWorldExpressGame(task or "coin", **kwargs)
    if name == "corridor":
        from empo2.envs.toy import CorridorEnv

        return CorridorEnv(**kwargs)
    raise ValueError(f"env: unknown environment {name!r}; allowed: {', '.join(ENV_NAMES)}")


def split_sizes(name: str, task: str) -> tuple[int, int] | None:
    """How many training and test variations environment `name` has for `task`, known without starting it;
    None where they depend on data files (WebShop: its goals), so that only the built environment can tell, or
    for an unknown task."""
    if name == "scienceworld":
        from empo2.envs.scienceworld import SPLIT_SIZES

        train, _, test = SPLIT_SIZES.get(task, (None, None, None))
        return None if train is None else (train, test)
    if name == "textworld_express":
        from empo2.envs.textworld_express import GAME_NAMES, GAMES_PER_FOLD

        return (GAMES_PER_FOLD, GAMES_PER_FOLD) if task in GAME_NAMES else None
    if name == "corridor":
        from empo2.envs.toy import CorridorEnv

        corridor = CorridorEnv()
        return len(corridor.train_variations), len(corridor.test_variations)
    return None


def env_from_config(cfg, task: str | None = None) -> TextEnv:
    """One environment instance as an `EMPO2Config` describes it (`task` replaces the config's, e.g. for adaptation).

    Each environment class reads the fields it knows (`from_config`).
    """
    if cfg.env not in ENV_NAMES:
        raise ValueError(f"env: unknown environment {cfg.env!r}; allowed: {', '.join(ENV_NAMES)}")
    if cfg.env == "scienceworld":
        from empo2.envs.scienceworld import ScienceWorldTask as environment
    elif cfg.env == "webshop":
        from empo2.envs.webshop import WebShopEnv as environment
    elif cfg.env == "textworld_express":
        from empo2.envs.textworld_express import TextWorldExpressGame as environment
    else:
        from empo2.envs.toy import CorridorEnv as environment
    return environment.from_config(cfg, task or cfg.task)


__all__ = ["ENV_NAMES", "GameError", "StepResult", "TextEnv", "env_from_config", "make_env", "snap_action", "split_sizes"]
