"""Every notebook runs top to bottom at the ci profile and records finite metrics and its figures.

All notebooks share one results folder, as they do for users: runs trained by
notebook 04 are reused by 02, 05 and 09. The folder starts as a copy of the
committed ci-profile results, so runs whose config still matches are reused
(exactly what `make run` does on a fresh clone) and any run whose config changed
is retrained; the training itself is tested in test_trainer*.py.
"""

import json
import math
import shutil

import pytest

from empo2.notebooks import ROOT, execute, notebook_paths

NOTEBOOKS = notebook_paths()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("notebook-results")
    if (ROOT / "results" / "ci").exists():
        shutil.copytree(ROOT / "results" / "ci", folder / "ci")
    return folder


def test_every_section_has_a_notebook():
    prefixes = [path.name[:2] for path in NOTEBOOKS]
    assert prefixes[:10] == [f"{i:02d}" for i in range(10)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_at_ci_profile(path, results):
    executed = execute(path, results, profile="ci")
    cells = json.loads(executed.read_text())["cells"]
    assert not any(o.get("output_type") == "error" for c in cells for o in c.get("outputs", []))
    figures = sorted((results / "figures").glob(f"{path.name[:2]}_*-ci.png"))
    assert figures, f"{path.name} saved no figure"
    assert all(f.stat().st_size > 5_000 for f in figures)
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
