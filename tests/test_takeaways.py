"""The takeaways state what the saved runs hold: the same differences as the claims table, every section of
docs/results.md computed, and "not yet run" (never a training run) where runs are missing."""

import re

from empo2.analysis import report, takeaways
from empo2.analysis.notebooks import ROOT


def test_every_difference_in_the_claims_table_is_quoted_alike_in_the_results_document():
    document = report.RESULTS_DOCUMENT.read_text()
    claims = report.claims(ROOT / "results", "laptop")
    quoted = 0
    for ours in claims["ours"]:
        found = re.search(r"([+-]\d+\.\d) \[([+-]\d+\.\d), ([+-]\d+\.\d)\]", ours)
        if found:
            difference, low, high = found.groups()
            assert f"{difference} [{low}, {high}]" in document, f"{ours!r} not in docs/results.md"
            quoted += 1
    assert quoted >= 10


def test_each_section_at_ci_is_computed_from_the_committed_runs():
    for notebook, title, section in takeaways.SECTIONS:
        text = section("ci", str(ROOT / "results"))
        lines = text.splitlines()
        assert lines and all(line.startswith("- ") for line in lines), (notebook, text)
        assert "not yet run" not in text and "nan" not in text, (notebook, text)


def test_missing_runs_read_not_yet_run_and_nothing_is_trained(tmp_path):
    document = takeaways.document(tmp_path, "laptop")
    assert document.count("not yet run at this profile") >= len(takeaways.SECTIONS)
    assert list(tmp_path.iterdir()) == []
