"""A scripted WebShop shopper that reads the goal: a reference score for the catalogue, not a learner."""

from __future__ import annotations

from typing import Iterable

from empo2.envs.webshop import WebShopEnv


def scripted_reference(env: WebShopEnv, variations: Iterable[int]) -> list[dict]:
    """A scripted, non-learning reference policy: search the instruction verbatim, open the first
    result, click the option values the goal names, buy. It reads the goal, so its score measures
    how much the catalogue's search gives away, not what a learner achieves. One row per goal."""
    rows = []
    for variation in variations:
        _, info = env.reset(variation)
        result = env.step(f"search[{info['goal']['instruction_text']}]")
        if env._results:
            result = env.step(f"click[{env._results[0].lower()}]")
            options = info["goal"].get("goal_options") or {}
            for value in options.values() if isinstance(options, dict) else options:
                if not result.done:
                    result = env.step(f"click[{value}]")
            if not result.done:
                result = env.step("click[buy now]")
        rows.append({"variation": variation, "score": result.score, "success": bool(result.info.get("success"))})
    return rows
