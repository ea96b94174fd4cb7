"""The interface every text environment of empo2 implements, and action snapping.

An environment runs one episode at a time on one task. The rollout code only
uses what is defined here, so ScienceWorld, WebShop and the toy corridor world
are interchangeable.

    env = make_env("scienceworld", task="power-component")
    observation, info = env.reset(variation=env.train_variations[0])
    result = env.step("open door to hallway")   # free text, snapped to a valid action
    result.reward, result.score, result.done
    env.close()
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol, Sequence

_WORD = re.compile(r"[a-z0-9]+")


class GameError(ValueError):
    """The environment cannot start its game as configured (bad parameters): no restart would help, so the run
    stops before it plays an episode."""


@dataclass
class StepResult:
    """What one `step` returns."""

    observation: str
    """Text the agent sees after the action."""
    reward: float
    """Score change caused by this step (the first step also counts the score reached at reset)."""
    score: float
    """Score after this step; the episode return is the score at the end."""
    done: bool
    """The episode is over (task solved, task failed, step limit, or environment restart)."""
    truncated: bool = False
    """The episode ended without the task deciding it (step limit or environment restart)."""
    info: dict = field(default_factory=dict)
    """raw_action, executed_action, valid_actions, state_text, plus environment-specific keys."""


class TextEnv(Protocol):
    """A text environment: one task, several variations, free-text actions."""

    task_name: str
    max_steps: int
    train_variations: list[int]
    test_variations: list[int]
    parallel_steps: bool
    """Whether several instances may `reset`/`step` at the same time from threads (the rollout then overlaps them)."""

    @classmethod
    def from_config(cls, cfg, task: str) -> "TextEnv":
        """An instance as an `EMPO2Config` describes it: the environment reads the fields it knows."""

    def reset(self, variation: int) -> tuple[str, dict]:
        """Start an episode. Returns the first observation and an info dict with
        `task_description`, `valid_actions` and `state_text`."""

    def step(self, text: str) -> StepResult:
        """Snap free text to a valid action, execute it, return the outcome."""

    def first_turn_text(self, task_description: str, observation: str, info: dict) -> str:
        """The agent's first user turn (chat prompts): the task, how to act here, the first observation."""

    def next_turn_text(self, observation: str, info: dict, step: int, max_steps: int) -> str:
        """A later user turn: what the last action did, and what this environment lists each step."""

    def close(self) -> None:
        """Free every resource (processes, files). Safe to call twice."""


def words(text: str) -> frozenset[str]:
    """Lower-cased alphanumeric word set of a text."""
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b|, 0 for two empty sets."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def snap_action(text: str, valid_actions: Sequence[str]) -> str:
    """The valid action whose word set is most similar (Jaccard) to `text`.

    An exact match (ignoring case and surrounding space) wins outright. Ties go
    to the action listed first, so the result is deterministic.
    """
    if not valid_actions:
        raise ValueError("snap_action: valid_actions is empty")
    cleaned = text.strip().lower()
    for action in valid_actions:
        if action.lower() == cleaned:
            return action
    text_words = words(text)
    best, best_score = valid_actions[0], -1.0
    for action in valid_actions:
        score = jaccard(text_words, words(action))
        if score > best_score:
            best, best_score = action, score
    return best
