"""Every line of the bash blocks of README.md and docs/*.md is accounted for here, and each command that can run on
a CPU runs and is judged by what it itself wrote or printed.

Run, in document order, at the `ci` profile (`--profile laptop` swapped for ci), each train in a results folder of
its own (`test_cpu_commands_run_and_do_what_the_docs_say`):

* `train` (also under `torchrun`, its trailing `...` dropped): its own folder holds one run, with the command's
  config, a metrics row per iteration, the episodes those rows count, and the summary of its last row;
  final weights only where the method trains them, no update where it does not (`naive`, `memory_only`); under
  `torchrun`, a checkpoint saved by as many processes as launched.
* `eval` (of the first train's run, as the docs show it beneath it): a new `evaluations/eval-001/` that was not
  there, one metrics row of the run's last checkpoint, its episodes those of the run's own final evaluation,
  the run's records untouched.
* `train ... --resume`: the first train command in a fresh folder, SIGKILLed after its first checkpoint once the
  next iteration's rows are written (an unfinished run); `--resume` keeps the rows before the checkpoint as the
  killed run wrote them (clock readings too: not replayed), replays the rest, and ends with the records of the
  first train's straight run (metrics and summary but their clock readings, episodes, tips, final weights). And
  the docs' "a finished run is reused": `--resume` of the first train's finished run says so and changes nothing.
* `train ... --overwrite` (of the first train's run, after `eval`): one run is left, every record rewritten, its
  evaluations gone, a metrics row per iteration (not two runs' rows), those of the same run trained again.
* `config --profile paper`: one line per config field, with the paper profile's value.

It ends by asserting that it checked exactly the documented CPU commands, in their order (their number comes
from the documents: 12 today, the benchmark's `--help` among them); a command it has no check for fails it.

Not run as a measurement: `python benchmarks/bench.py`. It times every throughput design several ways (three
rollouts, decode steps with and without levers, environment replays, an update pass, two trainers' iterations):
even at a group of 2 episodes of 3 steps (`--group 2 --steps 3`) it took 11.5 minutes on a 2-core machine
shared with trainings, and it asserts nothing. Its `--help` runs instead: the script imports and lists its
options (`BENCHMARK_CHECKS`).

Built and validated as the command line would, not run (they need a GPU; `test_gpu_commands_have_valid_configs`):
`--profile paper` trainings and `accelerate launch`.

Not run (`SKIPPED`, with the reason; a documented line that is in none of these lists fails
`test_every_documented_line_is_run_validated_or_skipped_with_a_reason`): `. .venv/bin/activate`, `make run`,
`make test`, `pip install -e '.[gpu]'`, `scripts/gpu_check.sh`.
"""

import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from empo2.__main__ import build_parser, config_from_args
from empo2.config import EMPO2Config
from tests.processes import reap_jvms_of

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = ("python -m empo2", "torchrun ", "accelerate launch ")
BENCHMARKS = "python benchmarks/"
SKIPPED = {
    ". .venv/bin/activate": "sets up a shell; the commands here run with this virtual environment's python",
    "make run": "the whole notebook suite (its own tests: tests/test_notebooks.py, tests/test_suite.py)",
    "make test": "this test suite itself",
    "pip install -e '.[gpu]'": "installs packages (vLLM, faiss-gpu) for GPUs",
    "scripts/gpu_check.sh": "trains on a GPU (device=cuda); docs/gpu.md reports its run",
}
BENCHMARK_CHECKS = {"python benchmarks/bench.py": ["--help"]}
"""What each documented benchmark runs with here (the module's docstring says why not its measurement)."""
CLOCK = "time/"
"""Metrics under this prefix are clock readings: they differ between two runs of the same config."""
RECORDS = ("config.json", "metrics.jsonl", "episodes.jsonl", "tips.jsonl", "summary.json", "final_weights.pt")

KILLED_AFTER_FIRST_CHECKPOINT = """
import os, signal, sys
from empo2.__main__ import main
from empo2.method.trainer import Trainer

save, saved = Trainer.save_checkpoint, []

def save_or_die(self):  # the first checkpoint is written; at the second the run has recorded one more iteration
    if saved:
        os.kill(os.getpid(), signal.SIGKILL)
    saved.append(save(self))
    return saved[-1]

Trainer.save_checkpoint = save_or_die
main(sys.argv[1:])
"""
"""`python -m empo2 ARGS` SIGKILLed as it starts its second checkpoint: an unfinished run, as a run killed then."""


def documented_lines() -> list[str]:
    """The lines of the bash blocks of README.md and docs/*.md (continuation lines joined, comments cut,
    spaces collapsed), in that order, each the first time it appears."""
    documents = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    blocks = [b for d in documents for b in re.findall(r"```bash\n(.*?)```", d.read_text(), flags=re.S)]
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    lines = [" ".join(re.sub(r"\s+#.*$", "", line).split()) for line in lines]
    return list(dict.fromkeys(line for line in lines if line))


def readme_commands() -> list[str]:
    """The documented lines that run the package or one of its benchmarks."""
    return [line for line in documented_lines() if line.startswith((*LAUNCHERS, BENCHMARKS))]


def _needs_gpu(command: str) -> bool:
    """Trains on a GPU: the paper profile or accelerate's GPU launch (printing a config needs none)."""
    return ("--profile paper" in command and " empo2 config " not in command) or command.startswith("accelerate launch")


def cpu_commands() -> list[str]:
    return [c for c in readme_commands() if not _needs_gpu(c)]


def _cli_words(command: str) -> list[str]:
    """The words after `-m empo2` (whatever launches it)."""
    words = shlex.split(command)
    return words[words.index("empo2") + 1 :]


def test_every_documented_line_is_run_validated_or_skipped_with_a_reason():
    lines, commands = documented_lines(), readme_commands()
    assert [line for line in lines if line not in commands and line not in SKIPPED] == [], \
        "a documented line this test neither runs nor skips: run it, or add it to SKIPPED with the reason"
    assert [line for line in SKIPPED if line not in lines] == [], "SKIPPED names a line the docs no longer show"
    assert any(c.startswith("python -m empo2 train") for c in commands)
    assert any(c.startswith("python -m empo2 eval") for c in commands)
    assert any(_needs_gpu(c) for c in commands) and any(c.startswith("torchrun") for c in commands)


@pytest.mark.parametrize("command", [c for c in readme_commands() if _needs_gpu(c)])
def test_gpu_commands_have_valid_configs(command, tmp_path):
    words = _cli_words(command)
    for i, word in enumerate(words):  # data files the command names: stand-ins that exist
        key, _, value = word.partition("=")
        if key.startswith("webshop_") and value.startswith("/"):
            (tmp_path / Path(value).name).write_text("{}")
            words[i] = f"{key}={tmp_path / Path(value).name}"
    cfg = config_from_args(build_parser().parse_args(words))  # SystemExit with the field's name if invalid
    assert cfg.profile == "paper" and cfg.device == "cuda"


# ---------------------------------------------------------------------------------------------------- helpers
def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(CLOCK)} for row in rows]


def _files(folder: Path) -> dict[str, bytes]:
    """A run's records (its checkpoints and evaluations aside), byte for byte."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not {"checkpoints", "evaluations"} & set(p.relative_to(folder).parts)}


def _runs_under(results: Path) -> list[Path]:
    """Every run folder under a results folder (evaluations aside)."""
    return sorted(p.parent for p in results.rglob("config.json") if "evaluations" not in p.parts)


class Commands:
    """Runs the documented commands as subprocesses in a scratch folder, with the repository on the path."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(self, command: str, words: list[str]) -> subprocess.CompletedProcess:
        done = subprocess.run(words, cwd=self.scratch, env=self.env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done

    def empo2(self, command: str, cli: list[str], launcher: list[str] = ()) -> subprocess.CompletedProcess:
        return self.run(command, [sys.executable, *launcher, "-m", "empo2", *cli])

    def killed_after_first_checkpoint(self, cli: list[str]) -> None:
        child = subprocess.Popen([sys.executable, "-c", KILLED_AFTER_FIRST_CHECKPOINT, *cli], cwd=self.scratch,
                                 env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, stderr = child.communicate(timeout=900)
        left = reap_jvms_of(child.pid)
        assert child.returncode == -signal.SIGKILL, stderr[-3000:]
        assert not left, f"JVMs {left} outlived the killed run"


def _config(cli: list[str]) -> EMPO2Config:
    return config_from_args(build_parser().parse_args(cli))


def _in(results: Path, cli: list[str]) -> list[str]:
    """The command's words, quiet, writing under `results`."""
    return [*cli, "--quiet", "--set", f"results_dir={results}"]


def check_train(commands: Commands, command: str, cli: list[str], results: Path) -> Path:
    """A train command's own folder: one run with the command's config, a metrics row per iteration (naive: one
    evaluation), the episodes those rows count, the summary of its last row, final weights only where the method
    trains any, and under torchrun a checkpoint of as many processes as it launched. Returns the run's folder."""
    words = shlex.split(command)
    launcher = []
    if words[0] == "torchrun":  # its options, before `-m empo2`
        launcher = ["-m", "torch.distributed.run", "--standalone", *words[1 : words.index("-m")]]
    cli = _in(results, cli)
    commands.empo2(command, cli, launcher)
    cfg = _config(cli)
    folder = cfg.run_dir
    assert _runs_under(results) == [folder], command
    saved = json.loads((folder / "config.json").read_text())["config"]
    assert saved == json.loads(cfg.to_json()), command  # the options it was given, e.g. --set p=0.5
    metrics, episodes = _rows(folder / "metrics.jsonl"), _rows(folder / "episodes.jsonl")
    evaluations = [i for i in range(1, cfg.iterations + 1) if i % cfg.eval_every == 0 or i == cfg.iterations]
    if cfg.method == "naive":  # evaluation only
        assert [r["iteration"] for r in metrics] == [0] and {e["phase"] for e in episodes} == {"eval"}, command
        evaluations = [0]
    else:
        assert [r["iteration"] for r in metrics] == list(range(1, cfg.iterations + 1)), command
        for i in range(1, cfg.iterations + 1):
            played = [e for e in episodes if e["phase"] == "train" and e["iteration"] == i]
            assert len(played) == cfg.group_size * cfg.groups_per_iteration, (command, i)
    tested = cfg.eval_samples * (cfg.eval_variations or cfg.n_test_variations)
    for row in metrics:
        evaluated = [e for e in episodes if e["phase"] == "eval" and e["iteration"] == row["iteration"]]
        assert len(evaluated) == (tested if row["iteration"] in evaluations else 0), (command, row["iteration"])
        assert row.get("eval/episodes", 0) == len(evaluated), (command, row["iteration"])
        if not cfg.trains_weights:
            assert not [key for key in row if key.startswith("update/")], (command, "an update ran")
    assert len(episodes) == (0 if cfg.method == "naive" else cfg.iterations * cfg.group_size * cfg.groups_per_iteration
                             ) + tested * len(evaluations), command
    assert json.loads((folder / "summary.json").read_text()) == metrics[-1], command
    assert (folder / "final_weights.pt").exists() == cfg.trains_weights, command
    if cfg.writes_tips:
        assert _rows(folder / "tips.jsonl"), (command, "no tips written")
    if launcher:
        import torch

        latest = folder / "checkpoints" / (folder / "checkpoints" / "latest").read_text()
        processes = torch.load(latest / "state.pt", weights_only=False)["processes"]
        nproc = int(words[words.index("--nproc_per_node") + 1])
        assert len(processes) == nproc, (command, f"a checkpoint of {len(processes)} processes")
    return folder


def check_eval(commands: Commands, command: str, cli: list[str], trained: Path) -> None:
    """`eval` of a finished run: a new evaluations/eval-001/ with one metrics row of the run's last checkpoint,
    whose episodes are those of the run's own final evaluation; the run's records untouched."""
    results = trained.parents[2]
    cli = _in(results, cli)
    cfg = _config(cli)
    assert cfg.run_dir == trained, f"{command} names another run than the train command above it"
    before = _files(trained)
    assert not (trained / "evaluations").exists()
    commands.empo2(command, cli)
    assert _files(trained) == before, f"{command} changed the run's records"
    assert sorted(p.name for p in (trained / "evaluations").iterdir()) == ["eval-001"], command
    evaluation = trained / "evaluations" / "eval-001"
    [row] = _rows(evaluation / "metrics.jsonl")
    latest = (trained / "checkpoints" / "latest").read_text()
    assert row["iteration"] == cfg.iterations and f"{latest}/weights.pt" in row["weights"], row["weights"]
    assert json.loads((evaluation / "summary.json").read_text()) == row
    played = _rows(evaluation / "episodes.jsonl")
    assert len(played) == row["eval/episodes"] > 0
    final = [(r["actions"], r["score"]) for r in _rows(trained / "episodes.jsonl")
             if r["phase"] == "eval" and r["iteration"] == cfg.iterations]
    assert [(r["actions"], r["score"]) for r in played] == final, "eval did not replay the run's final evaluation"


def check_resume(commands: Commands, command: str, cli: list[str], straight: dict, results: Path) -> None:
    """`train ... --resume` of a run SIGKILLed after its first checkpoint (in `results`), once the next iteration's
    rows were written: it keeps the rows up to the checkpoint as the killed run wrote them, replays the rest, and
    ends with the straight run's records (`straight`: its files), clock readings aside. Then `--resume` of the
    finished straight run says it has nothing to resume and changes nothing."""
    resume = _in(results, cli)
    unfinished = resume[: resume.index("--resume")] + resume[resume.index("--resume") + 1 :]
    commands.killed_after_first_checkpoint(unfinished)
    folder = _config(resume).run_dir
    assert not (folder / "summary.json").exists() and not (folder / "final_weights.pt").exists()
    assert (folder / "checkpoints" / "latest").read_text() == "iter-00001"
    killed = _rows(folder / "metrics.jsonl")
    assert [r["iteration"] for r in killed] == [1, 2]  # iteration 2 recorded after the checkpoint

    commands.empo2(command, resume)
    assert _runs_under(results) == [folder], command
    metrics = _rows(folder / "metrics.jsonl")
    assert metrics[0] == killed[0], "the rows before the checkpoint were played again, not resumed"
    assert _untimed(metrics) == _untimed(_rows_of(straight, "metrics.jsonl"))
    assert _untimed([json.loads((folder / "summary.json").read_text())]) == \
        _untimed([json.loads(straight["summary.json"])])
    for name in ("episodes.jsonl", "tips.jsonl"):
        assert _rows(folder / name) == _rows_of(straight, name), name
    import torch

    weights = torch.load(folder / "final_weights.pt")
    uninterrupted = torch.load(io.BytesIO(straight["final_weights.pt"]))
    assert weights.keys() == uninterrupted.keys() and all(torch.equal(weights[k], uninterrupted[k]) for k in weights)


def check_resume_of_a_finished_run(commands: Commands, command: str, cli: list[str], trained: Path) -> None:
    """The docs' "(a finished run is reused)": `--resume` of a finished run changes none of its records."""
    before = _files(trained)
    done = commands.empo2(command, _in(trained.parents[2], cli))
    assert "nothing to resume" in done.stdout, done.stdout[-2000:]
    assert _files(trained) == before


def _rows_of(files: dict[str, bytes], name: str) -> list[dict]:
    return [json.loads(line) for line in files[name].decode().splitlines()]


def check_overwrite(commands: Commands, command: str, cli: list[str], trained: Path) -> None:
    """`train ... --overwrite` of a run: one run is left, every record rewritten, the run's evaluations gone,
    a metrics row per iteration (not two runs'), those of the same config trained again."""
    results = trained.parents[2]
    cli = _in(results, cli)
    assert _config(cli).run_dir == trained
    written = {name: (trained / name).stat().st_mtime_ns for name in RECORDS}
    metrics = _rows(trained / "metrics.jsonl")
    assert (trained / "evaluations").exists()  # what eval wrote beside it
    commands.empo2(command, cli)
    assert _runs_under(results) == [trained], command
    assert not (trained / "evaluations").exists(), f"{command} kept the old run's evaluations"
    rewritten = [name for name in RECORDS if (trained / name).stat().st_mtime_ns != written[name]]
    assert rewritten == list(RECORDS), f"{command} left {set(RECORDS) - set(rewritten)} as they were"
    assert _untimed(_rows(trained / "metrics.jsonl")) == _untimed(metrics), command


def check_config(commands: Commands, command: str) -> None:
    """`config --profile NAME`: one line per config field, `name = value  # help`, with that profile's values."""
    words = shlex.split(command)
    profile = words[words.index("--profile") + 1]
    printed = commands.run(command, [sys.executable, *words[1:]]).stdout
    cfg = EMPO2Config.from_profile(profile)
    for field in fields(cfg):
        value = repr(getattr(cfg, field.name))
        assert len(re.findall(rf"^{field.name} +={' '}{re.escape(value)} +# \S", printed, flags=re.M)) == 1, \
            (command, field.name, value)
    shown = re.findall(r"^(\w+) += ", printed, flags=re.M)
    assert shown == [field.name for field in fields(cfg)], command
    if profile == "paper":
        assert (cfg.model, cfg.device, cfg.lora_rank) == ("Qwen/Qwen2.5-7B-Instruct", "cuda", 0)


def check_bench(commands: Commands, command: str) -> None:
    """A documented benchmark with its `BENCHMARK_CHECKS` arguments (`--help`): it imports and lists its options."""
    assert command in BENCHMARK_CHECKS, f"{command}: say in BENCHMARK_CHECKS how it runs here"
    words = shlex.split(command)
    printed = commands.run(command, [sys.executable, str(ROOT / words[1]), *BENCHMARK_CHECKS[command]]).stdout
    assert printed.startswith("usage: bench.py") and "--group GROUP" in printed and "--steps STEPS" in printed, \
        printed[-2000:]


# ---------------------------------------------------------------------------------------------------- the test
def test_cpu_commands_run_and_do_what_the_docs_say(tmp_path):
    """Every CPU command of the docs, in their order, each checked by its own output (the module's docstring)."""
    commands = Commands(tmp_path / "cwd")
    commands.scratch.mkdir()
    first, straight, checked = None, None, []  # the first train command: its words, folder and records
    for number, command in enumerate(cpu_commands()):
        command = command.replace("--profile laptop", "--profile ci")
        results = tmp_path / f"command-{number}"
        if command.startswith(BENCHMARKS):
            check_bench(commands, command)
        elif command.startswith("python -m empo2 config"):
            check_config(commands, command)
        else:
            cli = _cli_words(command)
            assert first is not None or cli[:2] != ["train", "..."] and cli[0] != "eval", \
                f"{command}: the docs show no train command before it"
            if cli[0] == "eval":
                check_eval(commands, command, cli, first[1])
            elif cli[:2] == ["train", "..."] and cli[2:] == ["--resume"]:  # the train command above, resumed
                check_resume(commands, command, first[0] + ["--resume"], straight, results)
                check_resume_of_a_finished_run(commands, command, first[0] + ["--resume"], first[1])
            elif cli[:2] == ["train", "..."] and cli[2:] == ["--overwrite"]:
                check_overwrite(commands, command, first[0] + ["--overwrite"], first[1])
            elif cli[0] == "train" and "..." not in cli[1:-1]:  # torchrun's trailing `...`: the options shown
                cli = [w for w in cli if w != "..."]
                folder = check_train(commands, command, cli, results)
                if first is None:
                    first, straight = (cli, folder), _files(folder)
            else:
                pytest.fail(f"no check for the documented command {command!r}: add one")
        checked.append(command)
    expected = [c.replace("--profile laptop", "--profile ci") for c in cpu_commands()]
    assert checked == expected and len(checked) == len(cpu_commands()), checked
