"""ScienceWorld (the paper's main benchmark) behind the `TextEnv` interface.

One `ScienceWorldTask` owns one ScienceWorld simulator, i.e. one JVM reached via
py4j, bound to one task. It follows the paper's protocol:

* train on the first `n_train_variations` of ScienceWorld's train split, test on
  the first `n_test_variations` of its test split (fewer when the split is shorter);
* `easy` simplification (teleport, open doors, self-watering pots, no electrical
  actions except on electricity tasks);
* free text is snapped to the valid action with the highest word-set Jaccard
  similarity (`snap_action`); the meta-commands `reset task` and `task` are never
  offered;
* score in [-100, 100]; the reward of a step is the score change, counted from 0 at
  reset, so the rewards of an episode sum to its final score;
* the episode ends when ScienceWorld says the task is completed or failed (a wrong
  `focus on` gives -100), or after `max_steps` steps (`truncated=True`).

Robustness, because long RL runs start thousands of episodes (`empo2.envs.jvm`, shared with TextWorldExpress):

* the JVM heap is capped (`jvm_heap`, default 1g: RSS about 400 MiB instead of a
  quarter of the machine's RAM), so a rollout group of 8 simulators fits a small box;
* JVM start + load and every step run under a time limit; a timeout or a dead JVM
  (py4j network error) kills the JVM and starts a fresh one on the same task and
  variation. A step that hits this ends its episode with `done=True,
  truncated=True, info["env_restarted"]=True`; `self.restarts` counts restarts;
* `close()` shuts the gateway down and makes sure the java process is gone; it is
  idempotent and also runs from `__del__` and at interpreter exit.

"Ambiguous request": when several objects fit an action, ScienceWorld answers
"Ambiguous request: ... 0: ... 1: ..." and waits for a number. `step` then answers
"0" (the first option) inside the same agent step, returns the observation of the
resolved action, and records `info["ambiguous"]=True` and the listed options in
`info["ambiguous_options"]`. ScienceWorld's own gold paths answer "0" at such
prompts too; `gold_actions` therefore drops those "0" entries by default.

An instance is not thread-safe; separate instances may be used from separate threads.
"""

from __future__ import annotations

import logging
import time

import scienceworld.scienceworld as _sw_module
from scienceworld import ScienceWorldEnv

from empo2.envs import jvm
from empo2.envs.base import StepResult
from empo2.envs.jvm import SimulatorError, SimulatorTimeout, running_jvm_pids  # noqa: F401 (re-exported)
from empo2.episode import failed
from empo2.prompts import first_turn, next_turn

logger = logging.getLogger(__name__)

# The 30 tasks and the sizes of their train, dev and test splits (variations), as the simulator lists them
# (scienceworld 1.2.3; tests/test_scienceworld.py asks it again): config validation reads them without a JVM.
SPLIT_SIZES: dict[str, tuple[int, int, int]] = {
    "boil": (14, 7, 9),
    "change-the-state-of-matter-of": (14, 7, 9),
    "chemistry-mix": (16, 8, 8),
    "chemistry-mix-paint-secondary-color": (18, 9, 9),
    "chemistry-mix-paint-tertiary-color": (18, 9, 9),
    "find-animal": (150, 75, 75),
    "find-living-thing": (150, 75, 75),
    "find-non-living-thing": (150, 75, 75),
    "find-plant": (150, 75, 75),
    "freeze": (14, 7, 9),
    "grow-fruit": (62, 31, 33),
    "grow-plant": (62, 31, 33),
    "identify-life-stages-1": (6, 3, 5),
    "identify-life-stages-2": (4, 2, 4),
    "inclined-plane-determine-angle": (84, 42, 42),
    "inclined-plane-friction-named-surfaces": (692, 346, 348),
    "inclined-plane-friction-unnamed-surfaces": (80, 40, 42),
    "lifespan-longest-lived": (62, 31, 32),
    "lifespan-longest-lived-then-shortest-lived": (62, 31, 32),
    "lifespan-shortest-lived": (62, 31, 32),
    "measure-melting-point-known-substance": (218, 109, 109),
    "measure-melting-point-unknown-substance": (150, 75, 75),
    "melt": (14, 7, 9),
    "mendelian-genetics-known-plant": (60, 30, 30),
    "mendelian-genetics-unknown-plant": (240, 120, 120),
    "power-component": (10, 5, 5),
    "power-component-renewable-vs-nonrenewable-energy": (10, 5, 5),
    "test-conductivity": (450, 225, 225),
    "test-conductivity-of-unknown-substances": (300, 150, 150),
    "use-thermometer": (270, 135, 135),
}
TASK_NAMES: tuple[str, ...] = tuple(SPLIT_SIZES)

# Episode length per task (the released code's table). Exact names,
# not prefixes: "chemistry-mix" is 60 but "chemistry-mix-paint-*" are 30.
DEFAULT_MAX_STEPS: dict[str, int] = {
    "chemistry-mix": 60,
    "grow-fruit": 60,
    "freeze": 80,
    "melt": 80,
    "change-the-state-of-matter-of": 80,
    "boil": 100,
    "measure-melting-point-known-substance": 120,
    # Not in the release's table (the paper does not use these tasks); this
    # project gives them the length of their closest sibling task.
    "grow-plant": 60,
    "measure-melting-point-unknown-substance": 120,
}
FALLBACK_MAX_STEPS = 30

# Entries of ScienceWorld's valid-action list that are commands to the simulator,
# not actions in the world: never offered to the agent, never snapped to.
META_ACTIONS = frozenset({"reset task", "task", "reset", "quit", "exit"})

_AMBIGUOUS_PREFIX = "Ambiguous request"
_STEP_LIMIT_OFF = 10**9  # ScienceWorldEnv's own step limit, disabled: we count steps.


def list_tasks() -> list[str]:
    """The 30 ScienceWorld task names (no JVM needed)."""
    return list(TASK_NAMES)


ACTION_TEMPLATES = (
    "look around; look at OBJ; look in OBJ; go to LOCATION; open OBJ; close OBJ; "
    "pick up OBJ; put down OBJ; move OBJ to OBJ; pour OBJ into OBJ; mix OBJ; "
    "activate OBJ; deactivate OBJ; connect OBJ to OBJ; disconnect OBJ; use OBJ on OBJ; "
    "read OBJ; wait; focus on OBJ"
)
"""The action syntax the first turn teaches (ScienceWorld's templates, in words)."""


def default_max_steps(task: str) -> int:
    """Episode length of a task in the paper's protocol."""
    return DEFAULT_MAX_STEPS.get(task, FALLBACK_MAX_STEPS)


# --------------------------------------------------------------------------- JVM

jvm.use_launch_options(_sw_module)


class _Simulator(ScienceWorldEnv):
    """ScienceWorldEnv whose lifetime the wrapper manages (no close in `__del__`)."""

    def __del__(self):  # ScienceWorldEnv.__del__ would talk to a possibly dead JVM
        pass


# --------------------------------------------------------------------------- env


def _filter_actions(actions) -> list[str]:
    """Valid actions without meta-commands and duplicates, in the simulator's order."""
    seen: set[str] = set()
    kept = []
    for action in actions:
        if action in seen or action.strip().lower() in META_ACTIONS:
            continue
        seen.add(action)
        kept.append(action)
    return kept or ["look around"]


def _ambiguous_options(observation: str) -> list[str]:
    """The numbered options listed in an "Ambiguous request" answer."""
    options = []
    for line in observation.splitlines():
        head, sep, rest = line.partition(":")
        if sep and head.strip().isdigit():
            options.append(rest.strip())
    return options


class ScienceWorldTask(jvm.JvmOwner):
    """One ScienceWorld task behind the `TextEnv` interface (one JVM per instance).

    >>> env = ScienceWorldTask("power-component")
    >>> observation, info = env.reset(env.train_variations[0])
    >>> result = env.step("go to the workshop")  # snapped to "go to workshop"
    >>> env.close()
    """

    parallel_steps = True
    """Instances may step at the same time from threads: each is its own JVM, and py4j waits outside the GIL."""

    def __init__(
        self,
        task: str,
        *,
        n_train_variations: int = 5,
        n_test_variations: int = 20,
        simplification: str = "easy",
        max_steps: int | None = None,
        jvm_heap: str = "1g",
        load_timeout_s: float = 60.0,
        step_timeout_s: float = 30.0,
        jvm_options: tuple[str, ...] = (),
    ):
        if task not in TASK_NAMES:
            raise ValueError(
                f"scienceworld: unknown task {task!r}; valid tasks: {', '.join(TASK_NAMES)}"
            )
        self.task_name = task
        self.simplification = simplification
        self.max_steps = int(max_steps) if max_steps is not None else default_max_steps(task)
        if self.max_steps < 1:
            raise ValueError(f"scienceworld: max_steps must be >= 1, got {self.max_steps}")
        self.jvm_heap = jvm_heap
        self.javaopts = ([f"-Xmx{jvm_heap}"] if jvm_heap else []) + list(jvm_options)
        self._own(f"scienceworld {task}", load_timeout_s, step_timeout_s)

        # Start the JVM and load the task (the split accessors need a loaded task).
        def read_splits():
            sim = self._sim
            return self._call(
                lambda: (
                    list(sim.get_variations_train()),
                    list(sim.get_variations_test()),
                    int(sim.get_max_variations(task)),
                ),
                self.load_timeout_s,
                "split lookup",
            )

        splits = self._open(variation=0, then=read_splits)
        self.all_train_variations, self.all_test_variations, self.n_variations = splits
        self.train_variations = self.all_train_variations[: max(0, n_train_variations)]
        self.test_variations = self.all_test_variations[: max(0, n_test_variations)]

    # ------------------------------------------------------------ JVM plumbing

    def _start(self, variation: int, gold: bool) -> None:
        """Start a JVM and load `variation` (one attempt, within load_timeout_s)."""
        self._ensure_open()
        self._kill_jvm()
        started = time.monotonic()
        self._sim, self._proc = jvm.launch(lambda: _Simulator(envStepLimit=_STEP_LIMIT_OFF), self.javaopts,
                                           self.load_timeout_s, "ScienceWorld")
        remaining = max(1.0, self.load_timeout_s - (time.monotonic() - started))
        self._load(variation, gold, remaining)

    def _load(self, variation: int, gold: bool, timeout: float) -> None:
        sim = self._sim
        self._call(
            lambda: sim.load(self.task_name, variation, self.simplification, generateGoldPath=gold),
            timeout,
            "load",
        )

    # ------------------------------------------------------------ episodes

    def _check_variation(self, variation: int) -> int:
        if isinstance(variation, bool) or not isinstance(variation, int) or not (
            0 <= variation < self.n_variations
        ):
            raise ValueError(
                f"scienceworld {self.task_name}: variation {variation!r} is not valid; "
                f"allowed: 0..{self.n_variations - 1} (train split uses "
                f"{self.all_train_variations[0]}..{self.all_train_variations[-1]}, "
                f"test split {self.all_test_variations[0]}..{self.all_test_variations[-1]})"
            )
        return variation

    def _snapshot(self, raw: dict) -> dict:
        """The per-state part of an info dict, from ScienceWorldEnv.step's infos."""
        return {
            "valid_actions": _filter_actions(raw["valid"]),
            "state_text": raw["look"],
            "inventory": raw["inv"],
            "task_description": raw["taskDesc"],
            "moves": raw["moves"],
        }

    def _reset_loaded(self, variation: int) -> tuple[str, dict]:
        """Reset the loaded variation and set up the episode bookkeeping."""
        sim = self._sim
        observation, raw = self._call(sim.reset, self.step_timeout_s, "reset")
        self._variation = variation
        self._steps = 0
        self._score = 0.0  # rewards count from 0, so they sum to the final score
        self._state = self._snapshot(raw)
        self._initial_score = float(raw["score"])
        self._episode_live = True
        info = {
            **self._state,
            "score": self._initial_score,
            "variation": variation,
            "env_restarted": False,
        }
        return observation, info

    @classmethod
    def from_config(cls, cfg, task: str) -> "ScienceWorldTask":
        """The task's JVM as an `EMPO2Config` describes it (splits cut to n_train / n_test; max_steps 0: the task's)."""
        return cls(task, n_train_variations=cfg.n_train_variations, n_test_variations=cfg.n_test_variations,
                   jvm_heap=cfg.jvm_heap, max_steps=cfg.max_steps or None)

    def first_turn_text(self, task_description: str, observation: str, info: dict) -> str:
        """The task, the action syntax, the one rule that ends episodes early (`focus on`), the inventory."""
        task = task_description.strip().removeprefix("Task Description:").strip()
        return first_turn(task, observation, (
            f"Actions you can use (OBJ and LOCATION are names from the observation): {ACTION_TEMPLATES}.\n"
            "In a room you have not seen yet, 'look around' first. Only 'focus on' the object the task "
            "names: focusing on anything else fails the task.\n"
            f"Inventory: {info.get('inventory', '').strip() or 'nothing'}\n"))

    def next_turn_text(self, observation: str, info: dict, step: int, max_steps: int) -> str:
        return next_turn(observation, step, max_steps)

    def reset(self, variation: int) -> tuple[str, dict]:
        """Load `variation` of the task and start an episode (observation = look around)."""
        self._ensure_open()
        variation = self._check_variation(variation)

        def load_and_reset():
            if self._sim is None:
                raise SimulatorError("ScienceWorld JVM is not running")
            self._load(variation, gold=False, timeout=self.load_timeout_s)
            return self._reset_loaded(variation)

        return self._reset_or_restart(variation, load_and_reset)

    def step(self, text: str) -> StepResult:
        """Snap `text` to a valid action, execute it, return the outcome."""
        action, step_info = self._begin_step(text)
        sim = self._sim

        def execute():
            observation, _, completed, raw = sim.step(action)
            options = None
            if observation.startswith(_AMBIGUOUS_PREFIX):
                options = _ambiguous_options(observation)
                observation, _, completed, raw = sim.step("0")
            return observation, completed, raw, options

        try:
            if sim is None:
                raise SimulatorError("ScienceWorld JVM is not running")
            observation, completed, raw, options = self._call(execute, self.step_timeout_s, "step")
        except jvm.CALL_FAILED as error:
            return self._restarted_step(step_info, error, ambiguous=False)

        score = float(max(-100, min(100, raw["score"])))
        reward = score - self._score
        self._score = score
        self._state = self._snapshot(raw)
        finished = bool(completed) or failed(score)
        truncated = not finished and self._steps >= self.max_steps
        done = finished or truncated
        if done:
            self._episode_live = False
        info = {
            **step_info,
            **self._state,
            "score": score,
            "ambiguous": options is not None,
            "env_restarted": False,
            "completed": bool(completed) and not failed(score),
            "failed": failed(score),
        }
        if options is not None:
            info["ambiguous_options"] = options
        return StepResult(
            observation=observation,
            reward=reward,
            score=score,
            done=done,
            truncated=truncated,
            info=info,
        )

    # ------------------------------------------------------------ extras

    def gold_actions(self, variation: int, keep_ambiguity_answers: bool = False) -> list[str]:
        """ScienceWorld's gold action sequence for `variation` (ends any running episode).

        By default the "0" entries that answer "Ambiguous request" prompts are dropped,
        because `step` answers them itself; feeding the result to `step` one by one
        then replays the gold path.
        """
        self._ensure_open()
        variation = self._check_variation(variation)
        self._episode_live = False

        def gold_path():
            sim = self._sim
            return self._call(sim.get_gold_action_sequence, self.step_timeout_s, "gold path")

        try:
            if self._sim is None:
                raise SimulatorError("ScienceWorld JVM is not running")
            self._load(variation, gold=True, timeout=self.load_timeout_s)
            actions = gold_path()
        except jvm.CALL_FAILED as error:
            actions = self._restart(variation, error, gold=True, then=gold_path)
        if not keep_ambiguity_answers:
            actions = [a for a in actions if a.strip() != "0"]
        return list(actions)

    def gold_transcript(self, variation: int) -> list[dict]:
        """Play ScienceWorld's gold path for `variation` verbatim (no snapping) and
        return one dict per action: action, observation, score. Meant for worked
        examples in prompts; ends any running episode.

        Verbatim matters: gold actions use phrasings that are not always in the
        valid-action list (e.g. "focus on thermometer in inventory"), and in `easy`
        mode "open door to X" is a no-op that snapping would turn into "close door".
        """
        actions = self.gold_actions(variation, keep_ambiguity_answers=True)
        sim = self._sim

        def play():
            sim.reset()
            transcript = []
            for action in actions:
                observation, _, completed, raw = sim.step(action)
                transcript.append({"action": action, "observation": observation, "score": float(raw["score"])})
                if completed:
                    break
            return transcript

        return self._call(play, self.step_timeout_s + 2.0 * len(actions), "gold transcript")

    def simulator_task_names(self) -> list[str]:
        """The task names as the running simulator lists them."""
        sim = self._sim
        return self._call(sim.get_task_names, self.step_timeout_s, "task names")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"jvm pid {self.jvm_pid}"
        return f"ScienceWorldTask({self.task_name!r}, max_steps={self.max_steps}, {state})"
