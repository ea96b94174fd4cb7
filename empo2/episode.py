"""What a rollout produces, read by the update, the loss and the analyses: an episode's `Mode`, its
`Turn`s, and the rules that every reader applies the same way.

| mode | code | played with tips | scored by π_θ with tips |
|---|---|---|---|
| PLAIN            | 0 | no  | no  |
| MEMORY_ON_POLICY | 1 | yes | yes |
| OFF_POLICY       | 2 | yes | no: the distillation step |

The rules, each written here only:
- a token is a *decision* unless constrained decoding allowed exactly one token there (`is_forced`);
  forced tokens get log-prob 0 when sampled, are never scored and count in no token total;
- an episode's return, the value GRPO compares within a group, is its final score plus its
  intrinsic (novelty) reward (`Episode.total_return`);
- an episode succeeded at a score of 100 or more and ended fatally at -100 or less (`succeeded`, `failed`).

This module imports nothing of the package but the chat message type, so every other module may import it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from empo2.chat import Message

SUCCESS_SCORE = 100.0
"""A score at or above this completes the task (ScienceWorld's and TextWorldExpress's 100, WebShop's perfect buy)."""
FAILURE_SCORE = -100.0
"""A score at or below this is ScienceWorld's fatal ending (e.g. focusing on the wrong object)."""


def succeeded(score):
    """Whether `score` (a number, or an array or Series of them) completes the task."""
    return score >= SUCCESS_SCORE


def failed(score):
    """Whether `score` (a number, or an array or Series of them) is a fatal ending."""
    return score <= FAILURE_SCORE


def is_forced(allowed: tuple[int, ...] | None) -> bool:
    """A token position where constrained decoding allowed exactly one token: no decision of the policy."""
    return allowed is not None and len(allowed) == 1


class Mode(enum.IntEnum):
    """An episode's mode: how it is played and in which context the update scores it (the table above)."""

    PLAIN = 0
    MEMORY_ON_POLICY = 1
    OFF_POLICY = 2

    @property
    def sampled_with_tips(self) -> bool:
        """The behaviour column: the episode acts with tips shown, and θ_old scores it with them."""
        return self is not Mode.PLAIN

    @property
    def trained_with_tips(self) -> bool:
        """The update column: π_θ scores the episode's tokens with its tips in context."""
        return self is Mode.MEMORY_ON_POLICY

    @property
    def label(self) -> str:
        return {Mode.PLAIN: "plain", Mode.MEMORY_ON_POLICY: "memory_on", Mode.OFF_POLICY: "off_policy"}[self]


PLAIN, MEMORY_ON_POLICY, OFF_POLICY = Mode
MODE_NAMES = {mode: mode.label for mode in Mode}


@dataclass
class Turn:
    """One agent step: what the policy saw, what it sampled, what happened."""

    prompt_ids: list[int]
    """Behaviour context: the conversation so far, with tips where they were shown."""
    prompt_ids_tip_free: list[int]
    """The same conversation with every tip block removed (token level)."""
    response_ids: list[int]
    behaviour_logprobs: list[float]
    """The sampler's log-prob of each response token (the tests check the update's against them)."""
    response_allowed: list[tuple[int, ...] | None] | None
    """Constrained decoding: per response token, the ids allowed when it was sampled; None: free text."""
    raw_action: str
    executed_action: str
    observation: str
    reward: float
    score: float
    tips_shown: list[str] = field(default_factory=list)
    state_text: str = ""
    """State in which the action was taken (memory key, novelty)."""
    intrinsic_reward: float = 0.0
    state_embedding: np.ndarray | None = field(default=None, repr=False)
    """Embedding of `state_text` when the rollout computed one (reused as the memory key)."""
    behaviour_entropies: list[float | None] = field(default_factory=list)
    """The sampler's entropy (nats) at each response token, over the allowed ids (None: not reported)."""

    def allowed_sets(self) -> list[tuple[int, ...] | None]:
        """Per response token: the ids allowed when it was sampled (None: any token)."""
        return self.response_allowed or [None] * len(self.response_ids)

    def decision_mask(self) -> list[bool]:
        """Per response token: True where the policy chose it, False where it was forced."""
        return [not is_forced(allowed) for allowed in self.allowed_sets()]


@dataclass
class Episode:
    """One episode of one task variation, with everything the update needs."""

    env_name: str
    task: str
    variation: int
    mode: Mode
    """PLAIN, MEMORY_ON_POLICY or OFF_POLICY."""
    messages: list[Message] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    score: float = 0.0
    """Final environment score, in [-100, 100] for ScienceWorld."""
    done: bool = False
    truncated: bool = False
    tip: str = ""
    tip_ids: list[int] = field(default_factory=list)
    """The tip's sampled token ids (its text is their decoding)."""
    tip_cut: bool = False
    """A free-text tip that the `tip_tokens` budget ended before the policy did."""
    seen_actions: dict[str, None] = field(default_factory=dict)
    """Constrained tips: the admissible actions of the states it acted in, in order (a constrained tip's slots)."""
    env_restarts: int = 0

    @property
    def sampled_with_tips(self) -> bool:
        """Acted with tips shown (memory-on-policy and off-policy); θ_old scores it with them."""
        return Mode(self.mode).sampled_with_tips

    @property
    def trained_with_tips(self) -> bool:
        """Scored by π_θ with its tips in context (memory-on-policy only; off-policy drops them)."""
        return Mode(self.mode).trained_with_tips

    @property
    def mode_name(self) -> str:
        return Mode(self.mode).label

    @property
    def intrinsic_return(self) -> float:
        return float(sum(turn.intrinsic_reward for turn in self.turns))

    @property
    def total_return(self) -> float:
        """What GRPO compares within a group: the final score plus the intrinsic (novelty) reward."""
        return self.score + self.intrinsic_return

    @property
    def success(self) -> bool:
        return bool(succeeded(self.score))

    def decision_mask(self) -> list[bool]:
        """Per action token of every turn, in order: True where the policy chose it."""
        return [decision for turn in self.turns for decision in turn.decision_mask()]

    def decision_count(self) -> int:
        """Action tokens the policy chose: the loss's token count for this episode."""
        return sum(self.decision_mask())

    def decision_entropy(self) -> float | None:
        """The mean entropy of the sampling distribution at the policy's decision tokens (forced tokens, whose
        entropy is 0, left out): how undecided the behaviour policy was. None where it was not reported."""
        values = [entropy for turn in self.turns for entropy, decision in zip(turn.behaviour_entropies,
                                                                             turn.decision_mask()) if decision]
        if not values or any(value is None for value in values):
            return None
        return float(np.mean(values))
