"""Every command in the code blocks of the README and docs/ runs: those that need no GPU at the `ci` profile (a tiny
budget), each in a results folder of its own; the GPU ones (`--profile paper`, `accelerate launch`)
have their configs built and validated as the command line would."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from empo2.__main__ import build_parser, config_from_args

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = ("python -m empo2", "torchrun ", "accelerate launch ")


def readme_commands() -> list[str]:
    """The commands of the bash blocks of README.md and docs/*.md that run the package (continuation lines
    joined, comments cut), in that order, each the first time it appears."""
    documents = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    blocks = [b for d in documents for b in re.findall(r"```bash\n(.*?)```", d.read_text(), flags=re.S)]
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    commands = [re.sub(r"\s+#.*$", "", line).strip() for line in lines]
    return list(dict.fromkeys(" ".join(c.split()) for c in commands if c.startswith(LAUNCHERS)))  # each once


def _needs_gpu(command: str) -> bool:
    """Trains on a GPU: the paper profile or accelerate's GPU launch (printing a config needs none)."""
    return ("--profile paper" in command and " empo2 config " not in command) or command.startswith("accelerate launch")


def _cli_words(command: str) -> list[str]:
    """The words after `-m empo2` (whatever launches it)."""
    words = shlex.split(command)
    return words[words.index("empo2") + 1 :]


def test_the_readme_shows_the_commands_this_test_runs():
    commands = readme_commands()
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


def test_cpu_commands_run_at_the_ci_profile(tmp_path):
    """Each command in a fresh results folder, `--profile laptop` swapped for ci; `eval` and `train ...`
    act on the run of the first train command (the one the docs show them under; the cheapest to train
    again), and `torchrun ... ...` runs with its ellipsis dropped."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    previous, previous_results, ran = None, None, []
    for number, command in enumerate(c for c in readme_commands() if not _needs_gpu(c)):
        command = command.replace("--profile laptop", "--profile ci")
        results = tmp_path / f"command-{number}"
        if command.startswith("python benchmarks/bench.py"):
            words = [sys.executable, str(ROOT / "benchmarks" / "bench.py"), "--group", "2", "--steps", "3"]
        elif command.startswith("python -m empo2 config"):
            words = [sys.executable, *shlex.split(command)[1:]]
        else:
            cli = _cli_words(command)
            if cli[:2] == ["train", "..."]:  # `train ... --resume`: the train command before, with these flags
                cli, results = previous + cli[2:], previous_results
            elif cli[0] == "eval":  # evaluates the run the train command before made
                results = previous_results
            elif cli[0] == "train" and previous is None:
                previous, previous_results = [w for w in cli if w != "..."], results
            cli = [w for w in cli if w != "..."]
            if cli[0] in ("train", "eval"):
                cli = cli + ["--quiet", "--set", f"results_dir={results}"]
            launcher = (["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
                        if command.startswith("torchrun") else [])
            words = [sys.executable, *launcher, "-m", "empo2", *cli]
        done = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        ran.append(command)
        if words[-1].startswith("results_dir=") or "--resume" in words:
            assert any(results.glob("ci/*/*/summary.json")), command
    assert len(ran) >= 8, ran
