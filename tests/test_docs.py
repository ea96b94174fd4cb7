"""The documents cite what exists: every `module.name` of the package and every repository path that
README.md, notebooks/README.md, results/README.md and the notebooks' markdown put in backticks."""

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest

import empo2
from empo2 import ROOT

DOCUMENTS = ["README.md", "notebooks/README.md", "results/README.md"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb"))
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
