"""The documents cite what exists: every `module.name` of the package and every repository path that
README.md, docs/, notebooks/README.md, results/README.md and the notebooks' markdown put in backticks, and
every page they link to; the README stays short."""

import importlib
import json
import pkgutil
import re

import pytest

from empo2 import ROOT
import empo2

DOCUMENTS = ["README.md", "notebooks/README.md", "results/README.md"] + sorted(
    str(p.relative_to(ROOT)) for p in [*(ROOT / "docs").glob("*.md"), *(ROOT / "notebooks").glob("*.ipynb")])
README_WORDS = 1200
"""The front page's length, its generated table of claims left out: what it is, the two commands, the method on
one screen, the notebooks, the command line, GPUs, the code map; the rest lives in docs/."""
MODULES = {m.name.rsplit(".", 1)[-1]: m.name for m in pkgutil.walk_packages(empo2.__path__, "empo2.")}
TOP_LEVEL = {p.name for p in ROOT.iterdir()}


def cited(document: str) -> set[str]:
    """What `document` puts in backticks: its text, or a notebook's markdown cells."""
    text = (ROOT / document).read_text()
    if document.endswith(".ipynb"):
        text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "markdown")
    return set(re.findall(r"`([^`\n]+)`", text))


FILE_SUFFIXES = {"json", "jsonl", "py", "md", "ipynb", "txt", "yml", "toml", "csv", "png", "sh", "html"}


def resolves(dotted: str) -> bool:
    """`trainer.Trainer`, `envs.webshop.WebShopEnv`, `update.PolicyUpdate.backward`: the longest importable
    module of the package, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(MODULES[parts[0]] + "".join("." + p for p in parts[1:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_package_name_a_document_cites_exists(document):
    missing = []
    for text in cited(document):
        match = re.fullmatch(r"(?:empo2\.)?([a-z_]\w*(?:\.\w+)+)(?:\(.*\))?", text)
        if match and match.group(1).split(".")[0] in MODULES and match.group(1).split(".")[-1] not in FILE_SUFFIXES:
            if not resolves(match.group(1)):
                missing.append(text)
    assert not missing, f"{document} cites names the package does not have: {sorted(missing)}"


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_repository_path_a_document_cites_exists(document):
    """A backticked path whose first part is a top-level entry of the repository (`empo2/`, `results/...`), read
    from the repository root or from the document's own folder."""
    folder = (ROOT / document).parent
    missing = []
    for text in cited(document):
        if not re.fullmatch(r"[\w.\-/]+", text) or "/" not in text:
            continue
        first = text.split("/")[0]
        if first in TOP_LEVEL and not (ROOT / text).exists():
            missing.append(text)
        elif first not in TOP_LEVEL and (folder / first).exists() and not (folder / text).exists():
            missing.append(text)
    assert not missing, f"{document} cites paths that do not exist: {sorted(missing)}"


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if d.endswith(".md")])
def test_every_page_a_document_links_to_exists(document):
    """Markdown links and images to files of the repository: `[docs/gpu.md](docs/gpu.md)`, `![...](results/...png)`."""
    text = (ROOT / document).read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith(("http", "#"))]
    missing = [t for t in targets if not ((ROOT / document).parent / t).exists()]
    assert targets or document != "README.md", "the README links to docs/"
    assert not missing, f"{document} links to files that do not exist: {missing}"


def test_the_readme_is_a_front_page():
    from empo2.analysis.report import BUDGETS_END, BUDGETS_START, CLAIMS_END, CLAIMS_START

    text = (ROOT / "README.md").read_text()
    before, _, rest = text.partition(CLAIMS_START)
    table, _, after = rest.partition(CLAIMS_END)
    assert table, "the README holds the generated table of claims"
    after, _, rest = after.partition(BUDGETS_START)
    budgets, _, end = rest.partition(BUDGETS_END)
    assert budgets, "the README holds the generated table of budgets"
    words = len((before + after + end).split())
    assert words <= README_WORDS, f"README.md has {words} words besides its generated tables (at most {README_WORDS})"
    for page in ("docs/results.md", "docs/design.md", "docs/gpu.md", "notebooks/README.md"):
        assert f"]({page})" in text, f"the README does not link to {page}"
