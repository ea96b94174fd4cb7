"""Every notebook runs top to bottom at the ci profile, records finite metrics and its figures, and its
executed copy reads cleanly; the committed notebooks are lessons, without outputs.

All notebooks share one results folder, as they do for users: runs trained by
notebook 04 are reused by 02, 05 and 09. The folder starts as a copy of the
committed ci-profile results, so runs whose config still matches are reused
(exactly what `make run` does on a fresh clone) and any run whose config changed
is retrained; the training itself is tested in test_trainer*.py.
"""

import base64
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys

import pytest

from empo2.analysis.notebooks import MACHINE_SPECIFIC, ROOT, clean, execute, notebook_paths

NOTEBOOKS = notebook_paths()
WIDGET = "application/vnd.jupyter.widget-view+json"
PROGRESS_TEXT = re.compile(r"\d+/\d+ \[\d+:\d+|\d+%\|")  # tqdm's "0/2 [00:00<?, ?it/s]" and " 0%|"
ABSOLUTE_PATH = re.compile(r"(?<![\w.~])/(?:[\w.-]+/)+(?:results|notebooks|empo2)/")  # e.g. /home/me/repo/results/


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("notebook-results")
    if (ROOT / "results" / "ci").exists():
        shutil.copytree(ROOT / "results" / "ci", folder / "ci")
    return folder


def _outputs(notebook: dict) -> list[dict]:
    return [o for c in notebook["cells"] for o in c.get("outputs", [])]


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    return "".join("".join(data[k]) if isinstance(data[k], list) else str(data[k])
                   for k in ("text/plain", "text/html", "text/markdown") if k in data)


def assert_reads_cleanly(notebook: dict, where: str) -> list[bytes]:
    """No progress widgets or bars, no PosixPath echoes, no absolute paths; each figure shown once.
    Returns the figures (PNG bytes) in order."""
    outputs = _outputs(notebook)
    figures = []
    for output in outputs:
        text = _text(output)
        assert WIDGET not in output.get("data", {}), f"{where}: a progress widget in the outputs"
        assert not PROGRESS_TEXT.search(text), f"{where}: progress-bar text in the outputs: {text[:200]!r}"
        assert "PosixPath" not in text, f"{where}: a PosixPath echo in the outputs: {text[:200]!r}"
        assert str(ROOT) not in text and not ABSOLUTE_PATH.search(text), \
            f"{where}: an absolute path in the outputs: {text[:200]!r}"
        if "image/png" in output.get("data", {}):
            figures.append(base64.b64decode("".join(output["data"]["image/png"])))
    assert len(set(figures)) == len(figures), f"{where}: a figure is shown more than once"
    metadata = json.dumps(notebook.get("metadata", {}))
    assert str(ROOT) not in metadata, f"{where}: the repository's absolute path in the metadata"
    return figures


def test_every_section_has_a_notebook():
    prefixes = [path.name[:2] for path in NOTEBOOKS]
    assert prefixes[:10] == [f"{i:02d}" for i in range(10)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_at_ci_profile(path, results):
    executed = execute(path, results, profile="ci")
    notebook = json.loads(executed.read_text())
    assert not any(o.get("output_type") == "error" for o in _outputs(notebook))
    figures = sorted((results / "figures").glob(f"{path.name[:2]}_*-ci.png"))
    assert figures, f"{path.name} saved no figure"
    assert all(f.stat().st_size > 5_000 for f in figures)
    shown = assert_reads_cleanly(notebook, executed.name)
    assert len(shown) == len(figures), f"{path.name}: {len(figures)} figures saved, {len(shown)} shown"
    assert notebook["metadata"]["papermill"]["input_path"] == f"notebooks/{path.name}"
    for metrics_file in (results / "ci").rglob("metrics.jsonl"):
        for line in metrics_file.read_text().splitlines():
            row = json.loads(line)
            for key in ("train/score", "eval/score", "update/loss"):
                if key in row:
                    assert math.isfinite(row[key]), f"{metrics_file}: {key} = {row[key]}"


def test_committed_notebooks_have_no_outputs():
    for path in NOTEBOOKS:
        notebook = json.loads(path.read_text())
        for cell in notebook["cells"]:
            assert not cell.get("outputs") and not cell.get("execution_count"), f"{path.name} has outputs"
        tagged = [c for c in notebook["cells"] if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{path.name} needs exactly one parameters cell"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebooks_are_lessons(path):
    """The idea with its equations and the code behind it first; "What to look for" before every
    figure; Takeaways and Exercises at the end."""
    cells = json.loads(path.read_text())["cells"]
    source = lambda cell: "".join(cell["source"])  # noqa: E731
    opening = source(cells[0])
    assert cells[0]["cell_type"] == "markdown" and "$$" in opening, f"{path.name}: no equation in the opening"
    assert re.search(r"`empo2\.[\w.]+`", opening), f"{path.name}: the opening names no empo2 function"
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "code" and re.search(r"save_figure\(|plot_variants\(", source(cell)):
            before = [c for c in cells[:index] if c["cell_type"] == "markdown"][-1]
            assert "What to look for" in source(before), f"{path.name}: cell {index} draws a figure unannounced"
    markdown = "\n".join(source(c) for c in cells if c["cell_type"] == "markdown")
    assert markdown.index("## Takeaways") < markdown.index("## Exercises"), f"{path.name}: Takeaways, then Exercises"
    assert not re.search(r"\b[A-Z]{4,}_\d\d\b", markdown), f"{path.name}: an unfilled placeholder"


def test_committed_executed_copies_read_cleanly():
    executed = sorted((ROOT / "results" / "executed").glob("*.ipynb"))
    assert executed, "no executed copies committed"
    for path in executed:
        assert_reads_cleanly(json.loads(path.read_text()), path.name)


def test_clean_makes_the_repository_path_relative_drops_the_clock_and_machine_and_merges_streams(tmp_path):
    import nbformat

    copy = tmp_path / "copy.ipynb"
    lines = [f"reusing {ROOT}/results/ci/x\n", f"cwd {ROOT}\n", f"{ROOT}-other\n"]
    cell = nbformat.v4.new_code_cell("print()", outputs=[nbformat.v4.new_output("stream", text="".join(lines[:2])),
                                                          nbformat.v4.new_output("stream", text=lines[2])])
    injected = nbformat.v4.new_code_cell('profile = "ci"', metadata={"tags": ["injected-parameters"]})
    versions = nbformat.v4.new_code_cell("print(torch.__version__)", metadata={"tags": [MACHINE_SPECIFIC]},
                                         outputs=[nbformat.v4.new_output("stream", text="2.13.0+cpu\n")])
    cell.metadata = {"execution": {"iopub.status.busy": "2026-12-02T17:31:01Z"},
                     "papermill": {"duration": 0.02, "start_time": "t0", "end_time": "t1", "status": "completed"}}
    notebook = nbformat.v4.new_notebook(cells=[cell, injected, versions], metadata={"papermill": {
        "input_path": f"{ROOT}/notebooks/00_quickstart.ipynb", "duration": 9.0, "start_time": "t0", "end_time": "t1"}})
    nbformat.write(notebook, copy)
    clean(copy)
    cleaned = json.loads(copy.read_text())
    assert cleaned["metadata"]["papermill"] == {"input_path": "notebooks/00_quickstart.ipynb"}
    assert len(cleaned["cells"][0]["outputs"]) == 1, "the stream's two flushes are one output"
    assert "".join(cleaned["cells"][0]["outputs"][0]["text"]) == "reusing results/ci/x\ncwd .\n" + f"{ROOT}-other\n"
    assert cleaned["cells"][0]["metadata"] == {"papermill": {"status": "completed"}}
    assert cleaned["cells"][1]["id"] == "injected-parameters"  # not papermill's random one
    assert cleaned["cells"][2]["outputs"] == [], "a machine-specific cell's output is left out"
    once = copy.read_text()
    clean(copy)
    assert copy.read_text() == once


def _fingerprint() -> dict[str, str]:
    """Every file `make run` may write (results/, README.md's claims, docs/results.md) by its content's hash; lock
    files aside."""
    files = [p for p in (ROOT / "results").rglob("*") if p.is_file() and not p.name.startswith(".")]
    files += [ROOT / "README.md", ROOT / "docs" / "results.md"]
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_make_run_changes_no_file():
    """`make run` on a fresh clone re-executes every notebook from the committed runs and rewrites the
    results index: it must leave `git status` clean, so every executed copy, figure and table it writes
    must come out byte for byte as committed (here: as they were before, so a working tree's own edits
    do not count)."""
    from empo2.analysis import suite

    missing = suite.unfinished("laptop", str(ROOT / "results"))
    assert not missing, f"laptop runs not committed (make run would train them): {missing}"
    before = _fingerprint()
    subprocess.run([sys.executable, "-m", "empo2.analysis.notebooks"], cwd=ROOT, check=True, capture_output=True)
    after = _fingerprint()
    changed = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    assert changed == [], f"make run changed or added: {changed}"
