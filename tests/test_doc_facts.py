"""The hand-written docs against the code and the committed runs: a notebook count, a profile's budget, a
run time or the GPU check's status that they state must not contradict what the repository holds."""

from __future__ import annotations

import json
import re

import pytest

from empo2 import ROOT
from empo2.analysis import report
from empo2.config import EMPO2Config

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
BUDGET_ITERATIONS = r"(?<!every )(?<!first )(?<!last )\b(\d+) iterations\b"  # not a cadence or a part of a run
NUMBERS = {word: n for n, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split())}


def documents() -> dict[str, str]:
    """Every prose document a reader meets: the README, docs/, the workshop guide and the notebooks' markdown."""
    texts = {path.relative_to(ROOT).as_posix(): path.read_text()
             for path in [ROOT / "README.md", ROOT / "notebooks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        texts[path.name] = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return texts


def sentences(text: str) -> list[str]:
    """Table rows one by one, and the prose between them cut into sentences (line breaks joined)."""
    rows = [line for line in text.splitlines() if line.startswith("|")]
    prose = " ".join(line for line in text.splitlines() if not line.startswith("|"))
    return rows + re.split(r"(?<=[.!?])\s+(?=[A-Z`*(])", prose)


def number(word: str) -> int | None:
    return int(word) if word.isdigit() else NUMBERS.get(word.lower())


def test_every_stated_count_of_all_the_notebooks_is_the_number_there_are():
    patterns = [r"\ball (\w+) notebooks\b", r"^(\w+) notebooks, one per\b", r"^\| all (\w+) \|"]
    stated = [(name, match.group(0), number(match.group(1)))
              for name, text in documents().items() for pattern in patterns
              for match in re.finditer(pattern, text, flags=re.IGNORECASE | re.MULTILINE)]
    assert any(name == "notebooks/README.md" for name, _, _ in stated), "the guide no longer states the count"
    wrong = [(name, phrase) for name, phrase, count in stated if count != len(NOTEBOOKS)]
    assert not wrong, f"there are {len(NOTEBOOKS)} notebooks, but: {wrong}"


@pytest.mark.parametrize("profile", ["ci", "laptop"])
def test_iterations_stated_for_a_profile_are_its_default_or_those_of_committed_runs(profile):
    runs = report.trained_runs(ROOT / "results", profile)
    allowed = {EMPO2Config.from_profile(profile).iterations} | {cfg["iterations"] for cfg, _ in runs}
    other = {"ci": "laptop", "laptop": "ci"}[profile]
    wrong = []
    for name, text in documents().items():
        for sentence in sentences(text):
            if f"`{profile}`" in sentence and f"`{other}`" not in sentence:
                wrong += [(name, sentence[:160]) for n in re.findall(BUDGET_ITERATIONS, sentence)
                          if int(n) not in allowed]
    assert not wrong, f"`{profile}` runs {sorted(allowed)} iterations, but: {wrong}"


def test_a_stated_laptop_run_time_covers_what_the_committed_runs_took():
    """A range of minutes a `laptop` run takes holds every committed run's (of the budget the sentence names)."""
    runs = report.trained_runs(ROOT / "results", "laptop")
    wrong = []
    for name, text in documents().items():
        for sentence in sentences(text):
            stated = re.findall(r"\b(\d+)[–-](\d+) minutes (?:per|a) (?:training )?run\b", sentence)
            if "`laptop`" not in sentence or not stated:
                continue
            iterations = {int(n) for n in re.findall(BUDGET_ITERATIONS, sentence)}
            minutes = [m for cfg, m in runs if not iterations or cfg["iterations"] in iterations]
            wrong += [(name, sentence[:160], f"runs took {min(minutes):.0f}–{max(minutes):.0f}")
                      for low, high in stated if not (float(low) <= min(minutes) * 1.1 and max(minutes) <= float(high) * 1.1)]
    assert not wrong, wrong


def test_no_doc_says_the_gpu_check_ran_on_cpu_only_once_it_ran_on_a_gpu():
    assert "ran on one NVIDIA" in (ROOT / "docs" / "gpu.md").read_text()
    wrong = [(name, sentence[:160]) for name, text in documents().items() for sentence in sentences(text)
             if "gpu_check" in sentence and re.search(r"\b(?:has )?run on CPU only\b", sentence)]
    assert not wrong, wrong


def seconds(cell: str) -> list[float]:
    """Every time in a table cell or sentence, in seconds: "101 s", "4–4.5 min", "12–15 minutes"."""
    found = []
    for low, high, unit in re.findall(r"(\d+(?:\.\d+)?)(?:[–-](\d+(?:\.\d+)?))? (s|min|minutes)\b", cell):
        scale = 1 if unit == "s" else 60
        found += [float(low) * scale] + ([float(high) * scale] if high else [])
    return found


def test_a_notebooks_stated_replay_time_agrees_with_the_guides_measured_one():
    guide = (ROOT / "notebooks" / "README.md").read_text()
    measured = {}
    for row in guide.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[4] not in ("—", ""):
            measured[cells[0].strip("`")] = seconds(cells[4].split("(")[0])
    assert "03_importance_ratios" in measured
    texts, wrong = documents(), []
    for path in NOTEBOOKS:
        for sentence in sentences(texts[path.name]):
            if path.stem in measured and re.search(r"takes? .*at the `laptop` profile", sentence):
                stated = seconds(sentence.split("at the `laptop` profile")[0])
                low, high = min(measured[path.stem]), max(measured[path.stem])
                wrong += [(path.name, sentence[:160]) for s in stated if not low / 2 <= s <= high * 2]
    assert not wrong, f"the guide measured {measured}, but: {wrong}"


def test_the_workshop_agenda_fits_a_half_day_and_each_block_starts_when_the_last_ends():
    guide = (ROOT / "notebooks" / "README.md").read_text()
    agenda = guide[guide.index("## Agenda"):].split("\n## ")[0]
    blocks = [[c.strip() for c in row.strip("|").split("|")] for row in agenda.splitlines()
              if re.match(r"\| \d:\d\d \|", row)]
    assert len(blocks) >= 5, "no agenda table found"
    clock = 0
    for start, minutes, *rest in blocks:
        hours, mins = map(int, start.split(":"))
        assert hours * 60 + mins == clock, f"the block {rest[0]!r} starts at {start}, the one before ends at {clock}"
        clock += int(minutes)
    assert clock <= 210, f"the agenda takes {clock} minutes, more than 3½ hours"
    assert re.search(rf"\({clock // 60}½ hours|\({clock / 60:g} hours", agenda), "the heading's total disagrees"
