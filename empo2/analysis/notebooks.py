"""Execute the notebook suite with papermill: `python -m empo2.analysis.notebooks`.

    python -m empo2.analysis.notebooks                      # every notebook at its default profile
    python -m empo2.analysis.notebooks --profile ci         # every notebook at the ci profile
    python -m empo2.analysis.notebooks --only 04 09         # some notebooks
    python -m empo2.analysis.notebooks --force              # retrain instead of reusing saved runs

Executed copies go to `results/executed/`, figures to `results/figures/` (the
notebooks save them); then `empo2.analysis.report` writes `results/README.md` (every run)
and the README's table of claims. Saved runs whose config matches are reused, so on a fresh
clone this regenerates every figure from the committed results.

The copies are meant to be read: progress bars are switched off while they run
(EMPO2_PROGRESS=0, TQDM_DISABLE=1 in the kernel's environment), the results folder
is passed relative to the repository root when it lies inside it, and any path of
the repository left in an output or in papermill's metadata is made relative.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

from empo2 import ROOT
from empo2.config import PROFILES
from empo2.envs.scienceworld import TASK_NAMES

NOTEBOOKS = ROOT / "notebooks"

PARAMETER_CHOICES: dict[str, tuple[str, ...]] = {"profile": PROFILES, "part2_profile": PROFILES, "task": TASK_NAMES,
                                                 "target_task": TASK_NAMES}
"""The values a notebook parameter of each of these names may take (the notebooks that have `task` are ScienceWorld
lessons)."""


def check_parameters(namespace: dict) -> None:
    """Stop a notebook whose parameters cannot run, with a one-line ValueError naming the parameter and what is
    allowed: a name papermill passed that the notebook's `parameters` cell does not define (papermill itself only
    warns, and the run would go on with the default), a value of another type than that cell's default, or a
    profile or ScienceWorld task that does not exist (`PARAMETER_CHOICES`).

    Every notebook calls it first thing after its parameters cell, with `globals()`. Papermill runs its injected
    cell (it starts with "# Parameters") right after the parameters cell, and the kernel's input history `In`
    holds both cells' text; in JupyterLab there is no injected cell and only the values are checked.
    """
    history = namespace.get("In", [])
    injected = next((i for i in range(len(history) - 1, 0, -1) if history[i].startswith("# Parameters\n")), None)
    if injected is not None:
        defaults, given = _assignments(history[injected - 1]), _assignments(history[injected])
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ValueError(f"unknown notebook parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                             f"this notebook takes {', '.join(defaults)}")
        for name, value in given.items():
            default = defaults[name]
            kinds = (int, float) if type(default) is float else (type(default),)
            if type(value) not in kinds:
                raise ValueError(f"{name}: {value!r} is not allowed; need {type(default).__name__} like its default "
                                 f"{default!r}")
    for name, allowed in PARAMETER_CHOICES.items():
        if name in namespace and namespace[name] not in allowed:
            raise ValueError(f"{name}: {namespace[name]!r} is not allowed; choose one of {', '.join(allowed)}")


def _assignments(cell: str) -> dict:
    """The names a cell of plain `name = literal` lines assigns, with their values, in order."""
    import ast

    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(cell).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}


def notebook_paths(only: list[str] | None = None) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if only:
        paths = [p for p in paths if any(p.name.startswith(prefix) for prefix in only)]
        if not paths:
            raise SystemExit(f"--only {' '.join(only)}: no notebook matches; have "
                             f"{', '.join(p.name for p in sorted(NOTEBOOKS.glob('*.ipynb')))}")
    return paths


QUIET = {"EMPO2_PROGRESS": "0", "TQDM_DISABLE": "1"}
"""Environment of the kernel during a papermill run: no progress bars in the executed copies."""


def execute(path: Path, results_dir: Path, *, profile: str | None = None, force: bool = False,
            timeout_s: int = 4 * 3600) -> Path:
    """Run one notebook with papermill; returns the executed copy's path."""
    import papermill

    results_dir = Path(results_dir).resolve()
    parameters = {"results_dir": _relative(results_dir), "force": force}
    if profile is not None:
        parameters["profile"] = profile
    # An explicit profile gets its own copy, so a ci pass never overwrites the default-profile copies.
    output = results_dir / "executed" / (path.name if profile is None else f"{path.stem}-{profile}.ipynb")
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _environment(QUIET):  # the kernel inherits this process's environment
            papermill.execute_notebook(
                str(path), str(output), parameters=parameters, cwd=str(ROOT), kernel_name="python3",
                execution_timeout=timeout_s, progress_bar=False, log_output=False,
            )
    finally:
        if output.exists():
            clean(output)
    return output


def _relative(folder: Path) -> str:
    """`folder` relative to the repository root (the notebooks' working directory) when inside it."""
    try:
        return str(folder.relative_to(ROOT))
    except ValueError:
        return str(folder)


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


VOLATILE_PAPERMILL_KEYS = ("start_time", "end_time", "duration")
"""Papermill's clock readings, per notebook and per cell: they differ on every run and say nothing about results."""


MACHINE_SPECIFIC = "machine-specific"
"""The tag of a cell whose output describes the machine that ran it (versions, paths): cleared in executed copies."""


def clean(executed: Path, root: Path = ROOT) -> None:
    """Make an executed copy independent of the machine and the moment that ran it: every occurrence of the
    repository's absolute path, in outputs and in papermill's metadata, becomes relative, and the clock
    readings (papermill's start, end and duration, the kernel's `execution` timestamps) are dropped, a cell's
    consecutive stream outputs are merged, the outputs of cells tagged `MACHINE_SPECIFIC` are cleared and the
    injected parameters cell gets a fixed id, so that re-executing a notebook whose results did not change
    leaves its copy byte for byte the same."""
    import nbformat
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    text = executed.read_text()
    path = re.escape(json.dumps(str(root))[1:-1])  # the path as it appears inside JSON strings
    notebook = nbformat.reads(re.sub(path + r"(?![\w.-])/?", lambda match: "" if match.group().endswith("/") else ".",
                                     text), as_version=4)
    # A cell's stdout arrives in as many outputs as the kernel flushed it, which timing decides (a subprocess's
    # line beside Python's prints): one output per stream, as nbconvert merges them.
    CoalesceStreamsPreprocessor().preprocess(notebook, {})
    for cell in notebook.cells:
        if "injected-parameters" in cell.metadata.get("tags", []):
            cell.id = "injected-parameters"  # papermill draws a new random id on every run
        if MACHINE_SPECIFIC in cell.metadata.get("tags", []):
            cell.outputs = []  # e.g. the versions installed here: each run records its own in config.json
    for metadata in [notebook.metadata] + [cell.metadata for cell in notebook.cells]:
        metadata.pop("execution", None)
        for key in VOLATILE_PAPERMILL_KEYS:
            metadata.get("papermill", {}).pop(key, None)
    cleaned = nbformat.writes(notebook)
    if cleaned != text:
        executed.write_text(cleaned)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=("ci", "laptop", "paper"), default=None,
                        help="override every notebook's default profile")
    parser.add_argument("--only", nargs="*", help="notebook number prefixes, e.g. 00 04")
    parser.add_argument("--force", action="store_true", help="retrain instead of reusing saved runs")
    parser.add_argument("--results-dir", default=str(ROOT / "results"))
    args = parser.parse_args(argv)
    results_dir = Path(args.results_dir).resolve()
    failures = []
    for path in notebook_paths(args.only):
        started = time.perf_counter()
        print(f"running {path.name} ...", flush=True)
        try:
            output = execute(path, results_dir, profile=args.profile, force=args.force)
            print(f"  done in {time.perf_counter() - started:.0f} s -> {output.relative_to(results_dir.parent)}")
        except Exception as error:  # keep going: one broken notebook should not hide the others
            failures.append(path.name)
            print(f"  FAILED after {time.perf_counter() - started:.0f} s: {type(error).__name__}: {error}")
    from empo2.analysis import report

    report.write(results_dir)  # the index of runs and the table of claims, from what is saved now
    print(f"wrote {_relative(results_dir / 'README.md')}", flush=True)
    if failures:
        sys.exit(f"{len(failures)} notebook(s) failed: {', '.join(failures)}")


if __name__ == "__main__":
    main()
