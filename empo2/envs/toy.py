"""A tiny pure-Python text world with the same interface as ScienceWorld.

It exists for fast unit tests of rollout, memory and trainer logic. It never
stands in for ScienceWorld in results.

The agent starts in room 0 of a corridor and must walk east to the last room
and `focus on` the target object there. Score: 10 per new room reached, 100
for focusing on the target (done), -100 for focusing on anything else (done).
"""

from __future__ import annotations

from empo2.envs.base import StepResult, snap_action
from empo2.prompts import first_turn, next_turn

_OBJECTS = ["apple", "battery", "red light bulb", "thermometer", "blue paint", "seed"]


class CorridorEnv:
    """Walk east along `2 + variation % 3` rooms and focus on the target object."""

    task_name = "corridor"
    parallel_steps = False  # pure Python: threads would only contend for the GIL

    def __init__(self, max_steps: int = 8, n_variations: int = 10):
        self.max_steps = max_steps
        self.train_variations = list(range(0, n_variations // 2))
        self.test_variations = list(range(n_variations // 2, n_variations))
        self._variation = None

    def _room_objects(self, room: int) -> list[str]:
        start = (room * 2 + self._variation) % len(_OBJECTS)
        return [_OBJECTS[start], _OBJECTS[(start + 1) % len(_OBJECTS)]]

    def _valid_actions(self) -> list[str]:
        actions = ["look around", "go east", "go west"]
        actions += [f"focus on {obj}" for obj in self._room_objects(self._room)]
        return actions

    def _describe(self) -> str:
        objects = ", ".join(self._room_objects(self._room))
        return f"You are in room {self._room} of {self._n_rooms}. You see: {objects}."

    def _info(self, **extra) -> dict:
        return {
            "task_description": self.task_description,
            "valid_actions": self._valid_actions(),
            "state_text": self._describe(),
            **extra,
        }

    @classmethod
    def from_config(cls, cfg, task: str = "corridor") -> "CorridorEnv":
        return cls(**({"max_steps": cfg.max_steps} if cfg.max_steps else {}))

    def first_turn_text(self, task_description: str, observation: str, info: dict) -> str:
        return first_turn(task_description, observation)

    def next_turn_text(self, observation: str, info: dict, step: int, max_steps: int) -> str:
        return next_turn(observation, step, max_steps)

    def reset(self, variation: int) -> tuple[str, dict]:
        if variation not in self.train_variations + self.test_variations:
            raise ValueError(
                f"variation {variation} is not valid for corridor; "
                f"allowed: 0..{len(self.train_variations + self.test_variations) - 1}"
            )
        self._variation = variation
        self._n_rooms = 2 + variation % 3
        self._room = 0
        self._steps = 0
        self._score = 0.0
        self._best_room = 0
        last_objects = self._room_objects(self._n_rooms - 1)
        self.target = last_objects[variation % 2]
        self.task_description = (
            f"Your task is to find the {self.target}. Walk east to the last room and focus on it."
        )
        return self._describe(), self._info()

    def step(self, text: str) -> StepResult:
        if self._variation is None:
            raise RuntimeError("call reset() before step()")
        action = snap_action(text, self._valid_actions())
        self._steps += 1
        previous_score, done = self._score, False
        if action == "go east" and self._room < self._n_rooms - 1:
            self._room += 1
            observation = f"You walk east. {self._describe()}"
        elif action == "go west" and self._room > 0:
            self._room -= 1
            observation = f"You walk west. {self._describe()}"
        elif action.startswith("focus on"):
            done = True
            if action == f"focus on {self.target}" and self._room == self._n_rooms - 1:
                self._score, observation = 100.0, "You focus on the target. Task completed."
            else:
                self._score, observation = -100.0, "That is not the target. Task failed."
        elif action == "look around":
            observation = self._describe()
        else:
            observation = "You cannot go that way."
        if self._room > self._best_room and not done:
            self._best_room = self._room
            self._score = 10.0 * self._room
        truncated = not done and self._steps >= self.max_steps
        return StepResult(
            observation=observation,
            reward=self._score - previous_score,
            score=self._score,
            done=done or truncated,
            truncated=truncated,
            info=self._info(raw_action=text, executed_action=action),
        )

    def close(self) -> None:
        self._variation = None
