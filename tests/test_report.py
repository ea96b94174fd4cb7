"""The generated index of runs and table of claims read the committed runs as they are."""

import json
import shutil

from empo2.analysis import report, takeaways
from empo2.analysis.notebooks import ROOT

ALLOWED_VERDICTS = {"reproduced", "opposite", "within the noise", "no difference (every score equal)",
                    "same direction, not established", "opposite direction, not established",
                    "same direction, not established (one seed each: seed spread not measured)",
                    "opposite direction, not established (one seed each: seed spread not measured)", "—",
                    "measured (a cost, not a difference)", "no difference: every score equal", "above 0 outside the noise",
                    "below 0 outside the noise", "above 0, not established", "below 0, not established"}


def test_index_lists_every_committed_run_with_its_commit_and_interval():
    table = report.runs_table(ROOT / "results", "ci")
    folders = report.run_folders(ROOT / "results", "ci")
    assert len(table) == len(folders) > 0
    for row, folder in zip(table.to_dict("records"), folders):
        saved = json.loads((folder / "config.json").read_text())
        assert row["commit"].startswith(saved["git_commit"][:7])
        if row["test episodes"]:
            assert row["low"] <= row["score"] <= row["high"]


def test_claims_table_between_the_readme_markers_is_replaced_and_the_rest_kept(tmp_path):
    shutil.copytree(ROOT / "results" / "ci", tmp_path / "results" / "ci")
    readme = tmp_path / "README.md"
    readme.write_text(f"# before\n{report.CLAIMS_START}\nstale\n{report.CLAIMS_END}\n# between\n"
                      f"{report.BUDGETS_START}\nstale too\n{report.BUDGETS_END}\n# after\n")
    report.write(tmp_path / "results", readme=readme)
    text = readme.read_text()
    assert text.startswith("# before\n") and text.endswith("# after\n") and "stale" not in text
    claims_block, budgets_block = text.split("# between\n")
    assert budgets_block.count("| `ci` |") == 3  # ScienceWorld, CoinCollector, WebShop; no laptop runs copied
    rows = [line for line in claims_block.splitlines() if line.startswith("| ") and not line.startswith("| claim")]
    assert len(rows) == len(report.claims(tmp_path / "results", "laptop"))
    assert all(row.rstrip(" |").split("| ")[-1].strip() in ALLOWED_VERDICTS for row in rows)
    index = (tmp_path / "results" / "README.md").read_text()
    assert "## Profile `ci`" in index and index.count("\n| ") >= len(report.run_folders(tmp_path / "results", "ci"))


def test_claims_compute_a_difference_with_an_interval_from_saved_runs():
    table = report.claims(ROOT / "results", "ci")
    assert set(table["verdict"]) <= ALLOWED_VERDICTS
    computed = table[~table["verdict"].isin({"—", "measured (a cost, not a difference)"})]
    assert len(computed) >= 8  # the ci runs of 04-08 and 10 are committed (their ci scores are all 0)
    for ours in computed["ours"]:
        difference, interval = ours.split(" [")[0].split()[-1], ours.split(" [")[1].split("]")[0]
        low, high = (float(x) for x in interval.split(", "))
        assert low <= float(difference) <= high


def test_the_committed_index_and_claims_table_are_current():
    """`python -m empo2.analysis.report` was run after the committed runs last changed."""
    assert (ROOT / "results" / "README.md").read_text() == report.results_readme(ROOT / "results")
    readme = (ROOT / "README.md").read_text()
    table = readme.split(report.CLAIMS_START)[1].split(report.CLAIMS_END)[0].strip()
    assert table == report.claims_markdown(report.claims(ROOT / "results", "laptop"))
    budgets = readme.split(report.BUDGETS_START)[1].split(report.BUDGETS_END)[0].strip()
    assert budgets == report.budgets_markdown(ROOT / "results")
    assert report.RESULTS_DOCUMENT.read_text() == takeaways.document(ROOT / "results")
