"""TextWorldExpress (`textworld-express`, by ScienceWorld's authors) behind the `TextEnv` interface.

A fast text game for watching learning on a laptop: a step costs about a millisecond in the JVM, the
observations are a few sentences and a state lists about ten admissible actions. One
`TextWorldExpressGame` owns one simulator JVM (reached via py4j, like ScienceWorld) bound to one game:

* `coin` ("search the environment and find the coin"): rooms joined by doors, the coin in one of
  them; exploration is the whole task. The other games of the package (`cookingworld`, `twc`,
  `mapreader`, `arithmetic`, `sorting`, `simonsays`, `peckingorder`) run the same way;
* the game's difficulty is its parameter string (`game_params`, e.g.
  "numLocations=5,numDistractorItems=0,includeDoors=1,limitInventorySize=0"); empty: `DEFAULT_PARAMS`;
* a variation is a game seed: training games are the first `n_train_variations` seeds of the
  package's train fold, held-out test games the first `n_test_variations` of its test fold;
* score in [-100, 100]: the game's own score (0 to 1, negative when a game fails) times 100, counted
  from 0 at reset, so the rewards of an episode sum to its final score; the episode ends when the game
  reports success or failure, or after `max_steps` steps (`truncated=True`);
* free text is snapped to the admissible action with the highest word-set Jaccard similarity; the
  admissible actions are kept sorted (the game's own order is a hash order); the first turn teaches the
  game's action syntax (`ACTION_TEMPLATES`), or, for a game without one, every turn lists them;
* a timeout or a dead JVM restarts the simulator (`empo2.envs.jvm`); the step that hits it ends its
  episode with `done=True, truncated=True, info["env_restarted"]=True`.

    env = TextWorldExpressGame("coin")
    observation, info = env.reset(env.train_variations[0])
    result = env.step("open door to south")
    env.close()
"""

from __future__ import annotations

import time

import textworld_express.textworld_express as _twx_module
from py4j.protocol import Py4JJavaError
from textworld_express import TextWorldExpressEnv

from empo2.envs import jvm
from empo2.envs.base import GameError, StepResult
from empo2.prompts import first_turn, next_turn

GAME_NAMES: tuple[str, ...] = ("coin", "cookingworld", "twc", "mapreader", "arithmetic", "sorting",
                               "simonsays", "peckingorder")
"""The games of textworld-express 1.1.0 (tests check the simulator's list)."""

DEFAULT_PARAMS: dict[str, str] = {
    "coin": "numLocations=5,numDistractorItems=0,includeDoors=1,limitInventorySize=0",
}
"""Each game's parameters when `game_params` is empty (games not listed: the package's defaults)."""

_ROOMS, _SWITCH = "numLocations", (0, 1)
GAME_PARAMETERS: dict[str, dict[str, tuple[int, int]]] = {
    "coin": {_ROOMS: (1, 11), "numDistractorItems": (0, 10), "includeDoors": _SWITCH, "limitInventorySize": _SWITCH},
    "cookingworld": {_ROOMS: (1, 11), "numIngredients": (1, 5), "numDistractorItems": (0, 10),
                     "includeDoors": _SWITCH, "limitInventorySize": _SWITCH},
    "twc": {_ROOMS: (1, 3), "numItemsToPutAway": (1, 4), "includeDoors": _SWITCH, "limitInventorySize": _SWITCH},
    "mapreader": {_ROOMS: (2, 48), "maxDistanceApart": (1, 8), "maxDistractorItemsPerLocation": (0, 3),
                  "includeDoors": _SWITCH, "limitInventorySize": _SWITCH},
    "simonsays": {"gameLength": (1, 1000), "numDistractors": (0, 5), "memorization": _SWITCH, "verbose": _SWITCH},
    "arithmetic": {}, "sorting": {}, "peckingorder": {},
}
"""Each game's parameters and their allowed integer ranges, both ends included: the keys are the ones the
simulator knows (it names them when it refuses an unknown one), the ranges the ones textworld-express 1.1.0
documents, narrowed where its simulator generates no game (twc takes at most 4 items; mapreader's first game
needs 2 to 48 locations); tests/test_textworld_express.py asks the simulator. It checks some ranges itself, and
reads a value that is not an integer as a failed load (every later game is an error message) and a switch of 2
as 0. Some combinations still generate no game for some seeds (mapreader with few locations): that game's
reset is a GameError."""

GAMES_PER_FOLD = 1000
"""Game seeds in each of a game's train, dev and test folds (the same for every game and difficulty; the tests
ask the simulator)."""


def parse_game_params(game: str, text: str) -> dict[str, int]:
    """The parameters `text` ("numLocations=4, includeDoors=1") sets for `game`, checked against
    `GAME_PARAMETERS`; a ValueError naming the field, the bad key or value and the allowed ones otherwise."""
    allowed = GAME_PARAMETERS[game]
    choices = ", ".join(f"{key} {low}..{high}" for key, (low, high) in allowed.items()) or "none"
    values = {}
    for item in (piece.strip() for piece in text.split(",")):
        if not item:
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        if key not in allowed:
            raise ValueError(f"game_params: {key!r} is not a parameter of {game}; allowed: {choices}")
        if key in values:
            raise ValueError(f"game_params: {key} is given twice in {text!r}")
        low, high = allowed[key]
        if not sep or not value.lstrip("-").isdigit() or not low <= int(value) <= high:
            raise ValueError(f"game_params: {item!r} is not allowed; {key} of {game} takes an integer in {low}..{high}")
        values[key] = int(value)
    return values

ACTION_TEMPLATES: dict[str, str] = {
    "coin": "move DIRECTION, open door to DIRECTION, close door to DIRECTION, take OBJECT, look around, inventory "
            "(DIRECTION: north, south, east or west)",
}
"""The action syntax the first turn teaches, per game; a game without one lists its admissible actions every turn.
Templates keep the conversation short: the list adds about 40 tokens a turn, and with it the untrained 135M
policy opened and closed doors in 16 of 20 steps instead of walking through them (8 coin games, 20 steps)."""

DEFAULT_MAX_STEPS = 20
_STEP_LIMIT_OFF = 10**9  # TextWorldExpressEnv's own step limit, disabled: we count steps.

jvm.use_launch_options(_twx_module)


class _Simulator(TextWorldExpressEnv):
    """TextWorldExpressEnv whose lifetime the wrapper manages (no close in `__del__`)."""

    def __del__(self):  # TextWorldExpressEnv.__del__ would talk to a possibly dead JVM
        pass


class TextWorldExpressGame(jvm.JvmOwner):
    """One TextWorldExpress game behind the `TextEnv` interface (one JVM per instance)."""

    parallel_steps = True
    """Instances may step at the same time from threads: each is its own JVM, and py4j waits outside the GIL."""

    def __init__(self, game: str = "coin", *, game_params: str = "", n_train_variations: int = 5,
                 n_test_variations: int = 20, max_steps: int | None = None, jvm_heap: str = "256m",
                 load_timeout_s: float = 60.0, step_timeout_s: float = 30.0):
        if game not in GAME_NAMES:
            raise ValueError(f"textworld_express: unknown game {game!r}; allowed: {', '.join(GAME_NAMES)}")
        self.task_name = game
        self.game_params = game_params or DEFAULT_PARAMS.get(game, "")
        parse_game_params(game, self.game_params)
        self.max_steps = int(max_steps) if max_steps else DEFAULT_MAX_STEPS
        self.javaopts = [f"-Xmx{jvm_heap}"] if jvm_heap else []
        self._own(f"textworld_express {game}", load_timeout_s, step_timeout_s)

        def read_folds():
            sim = self._sim
            folds = self._call(lambda: (list(sim.getValidSeedsTrain()), list(sim.getValidSeedsDev()),
                                        list(sim.getValidSeedsTest())), self.load_timeout_s, "fold lookup")
            self._generate(folds[0][0], "train")  # a game that does not start is an error here, before any episode
            return folds

        folds = self._open(variation=None, then=read_folds)
        self._folds = dict(zip(("train", "dev", "test"), (frozenset(seeds) for seeds in folds)))
        self.train_variations = folds[0][: max(0, n_train_variations)]
        self.test_variations = folds[2][: max(0, n_test_variations)]

    @classmethod
    def from_config(cls, cfg, task: str) -> "TextWorldExpressGame":
        """The game's JVM as an `EMPO2Config` describes it (max_steps 0: `DEFAULT_MAX_STEPS`)."""
        return cls(task, game_params=cfg.game_params, n_train_variations=cfg.n_train_variations,
                   n_test_variations=cfg.n_test_variations, max_steps=cfg.max_steps or None)

    # ------------------------------------------------------------ JVM plumbing

    def _start(self, variation: int | None, gold: bool) -> None:
        """Start a JVM and load the game (and the game of `variation`, unless None), within load_timeout_s."""
        self._ensure_open()
        self._kill_jvm()
        started = time.monotonic()
        self._sim, self._proc = jvm.launch(lambda: _Simulator(envStepLimit=_STEP_LIMIT_OFF), self.javaopts,
                                           self.load_timeout_s, "TextWorldExpress")
        sim = self._sim
        remaining = max(1.0, self.load_timeout_s - (time.monotonic() - started))
        try:
            self._call(lambda: sim.load(self.task_name, self.game_params), remaining, "load")
        except ValueError as error:  # the simulator refused the parameters: no restart will change that
            raise GameError(f"textworld_express {self.task_name}: game_params {self.game_params!r} refused by "
                            f"the simulator: {str(error).strip()}") from None

    # ------------------------------------------------------------ episodes

    def _fold(self, variation: int) -> str:
        if not isinstance(variation, bool) and isinstance(variation, int):
            for fold, seeds in self._folds.items():
                if variation in seeds:
                    return fold
        raise ValueError(
            f"textworld_express {self.task_name}: variation {variation!r} is not a game seed; allowed: "
            + ", ".join(f"{fold} {min(seeds)}..{max(seeds)}" for fold, seeds in self._folds.items()))

    @staticmethod
    def _snapshot(raw: dict) -> dict:
        """The per-state part of an info dict, from the simulator's infos."""
        return {
            "valid_actions": sorted(set(raw["validActions"])) or ["look around"],
            "state_text": raw["look"],
            "inventory": raw["inventory"],
            "task_description": raw["taskDescription"],
        }

    def _reset_loaded(self, variation: int) -> tuple[str, dict]:
        observation, raw = self._generate(variation, self._fold(variation))
        self._variation, self._steps, self._score = variation, 0, 0.0
        self._state = self._snapshot(raw)
        self._episode_live = True
        return observation, {**self._state, "score": 0.0, "variation": variation, "env_restarted": False}

    def _generate(self, variation: int, fold: str) -> tuple[str, dict]:
        """The first observation and infos of game `variation`; GameError where the simulator generates no game
        (a Java exception while generating, or an error message and no action after a load it did not report)."""
        sim = self._sim
        try:
            observation, raw = self._call(lambda: sim.reset(seed=variation, gameFold=fold, generateGoldPath=False),
                                          self.step_timeout_s, "reset")
        except Py4JJavaError as error:  # the same parameters and seed would fail again in a fresh JVM
            observation, raw = f"ERROR: {error.java_exception.getMessage()}", {"validActions": []}
        if observation.startswith("ERROR") or not any(action.strip() for action in raw["validActions"]):
            raise GameError(f"textworld_express {self.task_name}: game {variation} did not start with game_params "
                            f"{self.game_params!r}: {' '.join(observation.split())[:160]}")
        return observation, raw

    def reset(self, variation: int) -> tuple[str, dict]:
        """Generate the game of seed `variation` and start an episode (observation = look around)."""
        self._ensure_open()
        self._fold(variation)
        return self._reset_or_restart(variation, lambda: self._reset_loaded(variation))

    def step(self, text: str) -> StepResult:
        """Snap `text` to an admissible action, execute it, return the outcome."""
        action, step_info = self._begin_step(text)
        sim = self._sim
        try:
            observation, _, _, raw = self._call(lambda: sim.step(action), self.step_timeout_s, "step")
        except jvm.CALL_FAILED as error:
            return self._restarted_step(step_info, error)
        score = float(max(-100.0, min(100.0, 100.0 * raw["score"])))
        reward, self._score = score - self._score, score
        self._state = self._snapshot(raw)
        succeeded, failed = bool(raw["tasksuccess"]), bool(raw["taskfailure"])
        truncated = not (succeeded or failed) and self._steps >= self.max_steps
        done = succeeded or failed or truncated
        self._episode_live = not done
        info = {**step_info, **self._state, "score": score, "env_restarted": False,
                "completed": succeeded, "failed": failed}
        return StepResult(observation, reward=reward, score=score, done=done, truncated=truncated, info=info)

    # ------------------------------------------------------------ prompts

    def first_turn_text(self, task_description: str, observation: str, info: dict) -> str:
        """The task, the game's action syntax (or the actions of this state), the first observation."""
        template = ACTION_TEMPLATES.get(self.task_name)
        how = f"Actions you can use: {template}.\n" if template else _actions_line(info)
        return first_turn(task_description.strip(), observation, how)

    def next_turn_text(self, observation: str, info: dict, step: int, max_steps: int) -> str:
        """The observation (and, for a game without a template, the actions of this state)."""
        return next_turn(observation, step, max_steps, "" if self.task_name in ACTION_TEMPLATES else _actions_line(info))

    # ------------------------------------------------------------ extras

    def gold_actions(self, variation: int) -> list[str]:
        """The game's gold action sequence for seed `variation` (ends any running episode)."""
        self._ensure_open()
        fold, sim = self._fold(variation), self._sim
        self._episode_live = False

        def gold_path():
            sim.reset(seed=variation, gameFold=fold, generateGoldPath=True)
            return list(sim.getGoldActionSequence())

        return self._call(gold_path, self.step_timeout_s, "gold path")

    def simulator_game_names(self) -> list[str]:
        """The game names as the running simulator lists them."""
        sim = self._sim
        return self._call(sim.getGameNames, self.step_timeout_s, "game names")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"jvm pid {self.jvm_pid}"
        return f"TextWorldExpressGame({self.task_name!r}, {self.game_params!r}, max_steps={self.max_steps}, {state})"


def _actions_line(info: dict) -> str:
    return f"Actions you can take now: {', '.join(info.get('valid_actions', []))}.\n"
