"""No command deletes a run's records unless asked, and a killed run loses nothing that resume cannot replay.

On the real `ci` profile (ScienceWorld's power-component, default model): `eval` writes beside a run and plays
its final weights, a second `train` refuses, and a command-line run is the run the notebooks read. On WebShop at
the paper profile (cut down to a few steps): full fine-tuning with a KL term updates. A run SIGKILLed while it
writes resumes with `--resume` to the records of a run never stopped (metrics but their clock readings, episodes,
tips, final weights): killed while writing a checkpoint on the real games at the `ci` profile, CoinCollector
(TextWorldExpress) and ScienceWorld's power-component; killed while writing a checkpoint or the final weights on
the toy corridor (seconds a run)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from empo2.__main__ import build_parser, config_from_args, main
from empo2.analysis import experiments, suite
from empo2.config import EMPO2Config
from empo2.method.trainer import Trainer
from tests.processes import reap_jvms_of

ROOT = Path(__file__).resolve().parents[1]
TIMING_PREFIX = "time/"


def _train_args(results_dir, *more):
    return ["train", "--profile", "ci", "--method", "empo2", "--task", "power-component", "--quiet",
            "--set", f"results_dir={results_dir}", *more]


def _files(folder: Path) -> dict[str, bytes]:
    """Every record of a run (its checkpoints and evaluations aside), byte for byte."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not {"checkpoints", "evaluations"} & set(p.relative_to(folder).parts)}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """A finished EMPO² run trained by the README's command line at the ci profile."""
    results = tmp_path_factory.mktemp("results")
    main(_train_args(results))
    folder = results / "ci" / "power-component" / "empo2-power-component-seed0"
    assert (folder / "summary.json").exists() and (folder / "final_weights.pt").exists()
    return results, folder


def test_eval_writes_beside_the_run_keeps_every_row_and_plays_its_final_weights(cli_run, capsys):
    results, folder = cli_run
    shutil.rmtree(folder / "checkpoints")  # as in every clone: checkpoints are not committed
    before = _files(folder)
    assert len(_rows(folder / "metrics.jsonl")) == 2 and len(_rows(folder / "tips.jsonl")) > 0

    main(["eval", *_train_args(results)[1:]])
    assert "final_weights.pt" in capsys.readouterr().out
    assert _files(folder) == before, "eval changed the run's records"
    evaluation = folder / "evaluations" / "eval-001"
    [row] = _rows(evaluation / "metrics.jsonl")
    assert row["weights"].startswith(str(folder / "final_weights.pt")) and row["iteration"] == 2
    # The run's final weights with its own sampling seeds replay the run's final evaluation; the base model
    # (what eval played before) is not what it loads.
    final = [(r["actions"], r["score"]) for r in _rows(folder / "episodes.jsonl")
             if r["phase"] == "eval" and r["iteration"] == 2]
    assert [(r["actions"], r["score"]) for r in _rows(evaluation / "episodes.jsonl")] == final
    trained = torch.load(folder / "final_weights.pt")
    assert any(value.abs().sum() > 0 for name, value in trained.items() if "lora_B" in name)

    first = _files(evaluation)
    main(["eval", *_train_args(results)[1:]])  # a second evaluation gets a folder of its own
    assert (folder / "evaluations" / "eval-002" / "summary.json").exists()
    assert _files(evaluation) == first and _files(folder) == before


def test_a_second_train_refuses_before_loading_anything_and_changes_nothing(cli_run, capsys):
    results, folder = cli_run
    before = _files(folder)
    for more, expected in (((), "already holds this run"), (("--set", "iterations=1"), "--experiment NAME"),
                           (("--resume", "--set", "iterations=1"), "another config (iterations 2 there, 1 asked)")):
        with pytest.raises(SystemExit) as refused:
            main(_train_args(results, *more))
        message = str(refused.value)
        assert expected in message and "\n" not in message and str(folder) in message, message
        assert _files(folder) == before
    main(_train_args(results, "--resume"))  # the same config, finished: reused, not replayed
    assert "nothing to resume" in capsys.readouterr().out
    assert _files(folder) == before


def test_a_command_line_run_is_the_run_the_notebooks_read(cli_run, capsys):
    results, folder = cli_run
    cfg = suite.main_run("ci", "empo2", str(results))
    assert cfg.run_dir == folder and experiments.is_finished(cfg)
    assert experiments.run(cfg, show_progress=False) == folder
    assert "reusing" in capsys.readouterr().out


def test_a_notebook_run_over_a_run_of_another_config_is_refused_not_deleted(cli_run):
    results, folder = cli_run
    before = _files(folder)
    other = EMPO2Config.from_dict({**suite.main_run("ci", "empo2", str(results)).to_dict(), "lr": 5e-4})
    with pytest.raises(FileExistsError, match="lr 0.0001 there, 0.0005 asked"):
        experiments.run(other, show_progress=False)
    assert _files(folder) == before


def test_webshop_paper_profile_full_finetuning_with_kl_runs_an_update(tmp_path):
    """The paper profile trains every weight and WebShop adds a KL term: the reference is a frozen copy."""
    cfg = EMPO2Config.from_profile("paper", env="webshop", model="smollm2-135m", device="cpu",
                                   results_dir=str(tmp_path), group_size=2, n_train_variations=1,
                                   n_test_variations=1, max_steps=2, response_tokens=8, tip_tokens=8, iterations=1,
                                   groups_per_iteration=1, minibatch_episodes=0)
    assert (cfg.lora_rank, cfg.kl_beta) == (0, 0.01)
    with Trainer(cfg, show_progress=False) as trainer:
        reference = trainer.update.reference
        assert reference is not None and not any(p.requires_grad for p in reference.parameters())
        frozen = {n: p.detach().clone() for n, p in reference.named_parameters()}
        embedding = trainer.model.get_input_embeddings().weight
        before = embedding.detach().clone()
        metrics = trainer.train_iteration()
        assert "update/skipped" not in metrics  # the KL term gives every episode a gradient
        assert metrics["update/kl_ref"] >= 0 and metrics["update/kl_ref"] < 1e-2  # the first step starts at it
        assert not torch.equal(before, embedding.detach())
        assert all(torch.equal(frozen[n], p) for n, p in reference.named_parameters())


KILLED_RUN = """
import json, os, signal, sys
from empo2 import runs
from empo2.config import EMPO2Config
from empo2.method import memory
from empo2.method.trainer import Trainer

cfg, where = EMPO2Config.from_dict(json.loads(sys.argv[1])), sys.argv[2]
save_memory, write_atomic = memory.TipMemory.save, runs.write_atomic

def kill(*_):
    os.kill(os.getpid(), signal.SIGKILL)

def save(self, directory):  # between the checkpoint's weights and its memory
    if where == "checkpoint" and directory.parent.name == ".partial-00002":
        kill()
    save_memory(self, directory)

def write(path, body):  # half-way through writing the final weights
    if where == "final weights" and path.name == runs.FINAL_WEIGHTS:
        return write_atomic(path, lambda f: (f.write(b"half a file"), f.flush(), kill()))
    write_atomic(path, body)

memory.TipMemory.save, runs.write_atomic = save, write
with Trainer(cfg, show_progress=False) as trainer:
    trainer.train()
"""


def _kill_while_writing(cfg: EMPO2Config, where: str) -> None:
    """Train `cfg` in a child process that SIGKILLs itself while writing iteration 2's checkpoint (`where` is
    "checkpoint") or the final weights; check that it died there, and that no JVM of it outlived it."""
    child = subprocess.Popen([sys.executable, "-c", KILLED_RUN, cfg.to_json(), where], cwd=ROOT, text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, stderr = child.communicate(timeout=600)
    left = reap_jvms_of(child.pid)
    assert child.returncode == -9, stderr[-2000:]
    assert not left, f"JVMs {left} outlived the killed run"
    folder = cfg.run_dir
    assert not (folder / "summary.json").exists() and not (folder / "final_weights.pt").exists()
    if where == "checkpoint":
        assert (folder / "checkpoints" / ".partial-00002" / "weights.pt").exists()  # half a checkpoint
        assert (folder / "checkpoints" / "latest").read_text() == "iter-00001"
        assert [r["iteration"] for r in _rows(folder / "metrics.jsonl")] == [1, 2]  # iteration 2 was recorded


def _assert_same_records(resumed: Path, straight: Path) -> None:
    """The records of a resumed run are those of a run never stopped: metrics and summary but their clock
    readings, every episode (actions, scores, tips shown and written), every tip, and the final weights."""
    without_timings = lambda rows: [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIX)}  # noqa: E731
                                    for r in rows]
    assert without_timings(_rows(resumed / "metrics.jsonl")) == without_timings(_rows(straight / "metrics.jsonl"))
    summary = lambda folder: without_timings([json.loads((folder / "summary.json").read_text())])  # noqa: E731
    assert summary(resumed) == summary(straight)
    assert _rows(resumed / "episodes.jsonl") == _rows(straight / "episodes.jsonl")
    assert _rows(resumed / "tips.jsonl") == _rows(straight / "tips.jsonl")
    weights, uninterrupted = (torch.load(f / "final_weights.pt") for f in (resumed, straight))
    assert weights.keys() == uninterrupted.keys()
    assert all(torch.equal(weights[n], uninterrupted[n]) for n in weights)


@pytest.mark.parametrize("where", ["checkpoint", "final weights"])
def test_a_run_killed_while_writing_resumes_exactly_from_the_previous_checkpoint(tmp_path, where):
    """The toy corridor, at both kill points: memory-augmented rollouts half the time and three iterations."""
    cfg = EMPO2Config.from_profile("ci", env="corridor", experiment="kill", results_dir=str(tmp_path), max_steps=3,
                                   response_tokens=8, tip_tokens=8, p=0.5, iterations=3 if where == "checkpoint" else 2,
                                   eval_every=1, checkpoint_every=1, n_test_variations=2, eval_variations=1, lr=1e-3,
                                   intrinsic_coef=1.0)
    _kill_while_writing(cfg, where)
    with Trainer(cfg, resume=True, show_progress=False) as trainer:
        assert trainer.iteration == (1 if where == "checkpoint" else 2)
        trainer.train()

    straight = EMPO2Config.from_dict({**cfg.to_dict(), "run_name": "straight"})
    with Trainer(straight, show_progress=False) as trainer:
        trainer.train()
    _assert_same_records(cfg.run_dir, straight.run_dir)


REAL_GAMES = {"coin": "textworld_express", "power-component": "scienceworld"}


@pytest.mark.parametrize("task", list(REAL_GAMES))
def test_a_real_game_run_killed_while_writing_a_checkpoint_resumes_exactly(tmp_path, request, task):
    """The `ci` profile's EMPO² run on a real game (real JVMs, the real model), SIGKILLed between the weights and
    the memory of its last checkpoint (iteration 2), then `train --resume`: iteration 2 is played again from
    iteration 1's checkpoint to the records of the same command never stopped. On ScienceWorld that is the
    module's command-line run (its config is the same but for where it lives)."""
    args = ["train", "--profile", "ci", "--env", REAL_GAMES[task], "--task", task, "--method", "empo2", "--quiet",
            "--set", f"results_dir={tmp_path}"]
    if task == "coin":  # every rollout memory-augmented: iteration 2 plays with the tips of the restored memory
        args += ["--set", "p=1.0"]
    cfg = config_from_args(build_parser().parse_args([*args, "--experiment", "kill"]))
    _kill_while_writing(cfg, "checkpoint")
    main([*args, "--experiment", "kill", "--resume"])
    if task == "power-component":
        _, straight = request.getfixturevalue("cli_run")
    else:
        main(args)
        straight = config_from_args(build_parser().parse_args(args)).run_dir
    where = {"results_dir", "experiment", "run_name"}
    assert {k: v for k, v in json.loads((straight / "config.json").read_text())["config"].items() if k not in where} \
        == {k: v for k, v in json.loads(cfg.to_json()).items() if k not in where}
    _assert_same_records(cfg.run_dir, straight)
    # What was compared: both phases' episodes and written tips; on CoinCollector iteration 2's episodes were shown
    # tips (retrieved from the memory its resume restored), and its modes differ from iteration 1's (drawn from the
    # restored generator: a fresh one draws iteration 1's again).
    episodes = _rows(straight / "episodes.jsonl")
    assert {r["phase"] for r in episodes} == {"train", "eval"} and _rows(straight / "tips.jsonl")
    if task == "coin":
        modes = [[r["mode"] for r in episodes if r["phase"] == "train" and r["iteration"] == i] for i in (1, 2)]
        assert modes[0] != modes[1]
        assert all(r["tips_shown"] for r in episodes if r["phase"] == "train" and r["iteration"] == 2)
