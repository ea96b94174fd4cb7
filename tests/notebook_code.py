"""The functions a notebook defines, for tests: its code cells made only of imports and definitions, run in order.

A lesson notebook writes its own playing and tables (`def` cells); a test takes them from the committed notebook,
so what it checks is the code a reader runs.
"""

from __future__ import annotations

import ast
import json

from empo2 import ROOT

DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef)


def defined_in(notebook: str) -> dict:
    """The names the definition cells of `notebooks/<notebook>.ipynb` bind; AssertionError when it has none."""
    namespace: dict = {}
    cells = json.loads((ROOT / "notebooks" / f"{notebook}.ipynb").read_text())["cells"]
    for cell in cells:
        body = ast.parse("".join(cell["source"])).body if cell["cell_type"] == "code" else []
        if any(isinstance(node, ast.FunctionDef) for node in body) and all(isinstance(node, DEFINITIONS) for node in body):
            exec(compile("".join(cell["source"]), f"{notebook}.ipynb", "exec"), namespace)
    assert any(isinstance(value, type(defined_in)) for value in namespace.values()), f"{notebook} defines no function"
    return namespace
