"""Bad input never makes a run: each value a user can get wrong ends in one line that names the field and what is
allowed, before the model loads, with nothing written; a notebook stops on a parameter it does not take.

The command-line cases run `python -m empo2`'s own `main` in this process with the policy's loader replaced by one
that fails the test, so "before the model loads" is checked, not assumed.
"""

from __future__ import annotations

import json

import papermill
import pytest

from empo2.__main__ import config_from_args, build_parser, main
from empo2.analysis.notebooks import NOTEBOOKS, check_parameters, notebook_paths
from empo2.config import EMPO2Config
from empo2.envs import env_from_config
from empo2.envs.jvm import running_jvm_pids
from empo2.method import trainer
from empo2.runs import RunFolder

COIN = ["--env", "textworld_express", "--task", "coin"]
WEBSHOP_TEST_GOALS = len(env_from_config(EMPO2Config.from_profile("ci", env="webshop")).test_variations)
"""The shipped WebShop data's held-out goals: only the built environment knows (a fifth of its goals)."""

REFUSED = [
    (["train", *COIN, "--set", "game_params=numLocations=abc"],
     "error: game_params: 'numLocations=abc' is not allowed; numLocations of coin takes an integer in 1..11"),
    (["train", *COIN, "--set", "game_params=numLocatons=3"],
     "error: game_params: 'numLocatons' is not a parameter of coin; allowed: numLocations 1..11, "
     "numDistractorItems 0..10, includeDoors 0..1, limitInventorySize 0..1"),
    (["train", *COIN, "--set", "game_params=includeDoors=2"],  # the simulator would read it as 0
     "error: game_params: 'includeDoors=2' is not allowed; includeDoors of coin takes an integer in 0..1"),
    (["train", "--task", "power-component", "--set", "game_params=numLocations=3"],
     "error: game_params: 'numLocations=3' is not allowed with env scienceworld; only TextWorldExpress games"),
    (["train", "--task", "power-component", "--set", "n_test_variations=100000"],
     "error: n_test_variations: 100000 is more than power-component's test split holds (5 variations); "
     "allowed 1..5"),
    (["eval", "--task", "power-component", "--set", "n_test_variations=6"],
     "error: n_test_variations: 6 is more than power-component's test split holds (5 variations); allowed 1..5"),
    (["train", *COIN, "--set", "n_train_variations=1001"],
     "error: n_train_variations: 1001 is more than coin's training split holds (1000 variations); allowed 1..1000"),
    (["train", "--env", "webshop", "--set", f"n_test_variations={WEBSHOP_TEST_GOALS + 1}"],  # once its data is read
     f"error: n_test_variations: {WEBSHOP_TEST_GOALS + 1} is more than webshop's test split holds ({WEBSHOP_TEST_GOALS} "
     f"variations); allowed 1..{WEBSHOP_TEST_GOALS}"),
]


@pytest.fixture
def no_model(monkeypatch):
    def load_policy(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was found")

    monkeypatch.setattr(trainer, "load_policy", load_policy)


@pytest.mark.parametrize("argv, says", REFUSED, ids=[" ".join(argv[1:]) for argv, _ in REFUSED])
def test_a_bad_value_is_one_line_before_the_model_loads_and_writes_nothing(argv, says, tmp_path, no_model):
    before = set(running_jvm_pids())
    with pytest.raises(SystemExit) as refused:
        main([*argv, "--profile", "ci", "--quiet", "--set", f"results_dir={tmp_path}"])
    message = str(refused.value)
    assert message.startswith(says) and "\n" not in message, message
    assert not any(tmp_path.iterdir())  # no run folder, no config.json
    assert set(running_jvm_pids()) == before


def test_a_profile_asks_for_up_to_its_split_sizes_and_the_config_says_what_runs():
    """The paper profile tests on up to 20 variations: power-component has 5, so its config says 5; a size the
    caller names is checked as given; naive plays no training game, so its training size is not cut."""
    assert EMPO2Config.from_profile("paper").n_test_variations == 5
    assert EMPO2Config.from_profile("paper", task="find-animal").n_test_variations == 20
    short = EMPO2Config.from_profile("laptop", task="identify-life-stages-2")
    assert (short.n_train_variations, short.n_test_variations) == (4, 4)
    assert EMPO2Config.from_profile("laptop", task="identify-life-stages-2", method="naive").n_train_variations == 5
    with pytest.raises(ValueError, match=r"^n_train_variations: 5 is more than identify-life-stages-2's training"):
        EMPO2Config.from_profile("laptop", task="identify-life-stages-2", n_train_variations=5)


def test_a_second_difficulty_of_a_game_is_refused_with_the_way_to_keep_both(tmp_path, no_model):
    """Two difficulties of one game share the default folder name: the second is refused with what differs and
    --experiment as the way to keep both, never pointed at --resume; with --experiment it has a folder of its own."""
    argv = ["train", *COIN, "--profile", "ci", "--quiet", "--set", f"results_dir={tmp_path}"]
    first = config_from_args(build_parser().parse_args(argv))
    RunFolder(first.run_dir).start({"config": first.to_dict()}, fresh=True)  # a run of the default difficulty
    saved = (first.run_dir / "config.json").read_bytes()
    harder = [*argv, "--set", "game_params=numLocations=8"]
    for more in ([], ["--resume"]):
        with pytest.raises(SystemExit) as refused:
            main([*harder, *more])
        message = str(refused.value)
        assert ("holds a run of another config (game_params '' there, 'numLocations=8' asked); keep both by giving "
                "this one its own folder with --experiment NAME") in message and "\n" not in message, message
        assert "--resume" not in message
        assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["config.json"]
        assert (first.run_dir / "config.json").read_bytes() == saved
    second = config_from_args(build_parser().parse_args([*harder, "--experiment", "coin-8-rooms"]))
    assert second.run_dir != first.run_dir and json.loads(saved)["config"]["game_params"] == ""


# ---------------------------------------------------------------------------------------------- notebooks
def _history(parameters: str, injected: str | None) -> dict:
    """A kernel's namespace after a parameters cell and, from papermill, its injected cell."""
    cells = ["", parameters] + ([f"# Parameters\n{injected}\n"] if injected is not None else [])
    namespace = {"In": cells + ["check_parameters(globals())"]}
    for cell in cells[1:]:
        exec(cell, {}, namespace)
    return namespace


@pytest.mark.parametrize("injected, says", [
    ('seeed = 3', "unknown notebook parameter seeed; this notebook takes profile, results_dir, force, task, seed"),
    ('seeed = 3\nforse = True', "unknown notebook parameters forse, seeed; this notebook takes profile"),
    ('profile = "lapton"', "profile: 'lapton' is not allowed; choose one of ci, laptop, paper"),
    ('seed = "3"', "seed: '3' is not allowed; need int like its default 0"),
    ('force = 1', "force: 1 is not allowed; need bool like its default False"),
    ('task = "power-components"', "task: 'power-components' is not allowed; choose one of boil, "),
])
def test_check_parameters_names_what_is_wrong(injected, says):
    parameters = 'profile = "laptop"  # ci | laptop | paper\nresults_dir = "results"\nforce = False\n' \
                 'task = "power-component"\nseed = 0'
    with pytest.raises(ValueError) as refused:
        check_parameters(_history(parameters, injected))
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)


def test_check_parameters_passes_good_ones_and_checks_values_in_jupyterlab():
    parameters = 'profile = "laptop"\nresults_dir = "results"\ntrials = 0\nratio = 0.5'
    check_parameters(_history(parameters, 'profile = "ci"\ntrials = 3\nratio = 1'))  # an int where a float was
    check_parameters(_history(parameters, None))
    with pytest.raises(ValueError, match="^profile: 'lapton' is not allowed"):
        check_parameters(_history(parameters.replace('"laptop"', '"lapton"'), None))  # edited in the cell


def test_every_notebook_checks_its_parameters_right_after_its_parameters_cell():
    for path in notebook_paths():
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        assert "parameters" in cells[0]["metadata"].get("tags", []), path.name
        assert "check_parameters(globals())" in "".join(cells[1]["source"]), path.name


@pytest.mark.parametrize("parameters, says", [
    ({"profile": "lapton"}, "ValueError: profile: 'lapton' is not allowed; choose one of ci, laptop, paper"),
    ({"seeed": 3}, "ValueError: unknown notebook parameter seeed; this notebook takes profile, results_dir, force, "
                   "task, seed"),
])
def test_papermill_fails_a_notebook_with_a_bad_parameter(parameters, says, tmp_path):
    with pytest.raises(papermill.PapermillExecutionError) as failed:
        papermill.execute_notebook(str(NOTEBOOKS / "00_quickstart.ipynb"), str(tmp_path / "out.ipynb"),
                                   parameters=parameters, kernel_name="python3", progress_bar=False, cwd=str(tmp_path))
    assert says in str(failed.value)
    assert not (tmp_path / "results").exists()
