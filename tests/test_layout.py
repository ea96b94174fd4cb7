"""The package's layers (docs/design.md, "Layout"): every import in `empo2`, lazy ones included, reaches only its
own floor or one below, and no import circle is left."""

import ast
import graphlib
import re

from empo2 import ROOT

PACKAGE = ROOT / "empo2"


def module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def floors() -> dict[str, int]:
    """The design notes' table: each row's floor and the modules or packages named in it (bare names are
    top-level modules of `empo2`)."""
    table = {}
    for line in (ROOT / "docs" / "design.md").read_text().splitlines():
        row = re.match(r"\| (\d) \| (.*?) \|", line)
        if row:
            for name in re.findall(r"`([\w.]+)`", row.group(2)):
                if name.isupper():  # a constant named beside its module (`ROOT`)
                    continue
                table[name if name.startswith("empo2") else f"empo2.{name}"] = int(row.group(1))
    return table


def floor_of(module: str, table: dict[str, int]) -> int:
    """The floor of the longest table entry that is `module` or a package holding it."""
    owners = [name for name in table if module == name or module.startswith(name + ".")]
    assert owners, f"{module} is in no row of docs/design.md's layout table"
    return table[max(owners, key=len)]


def imports(path) -> set[str]:
    """The empo2 modules `path` imports (a `from empo2.x import y` names module empo2.x.y when there is one)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "empo2":
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "empo2"}
    return found


def upward_imports(modules: dict[str, object], table: dict[str, int]) -> list[str]:
    return [f"{module} (floor {floor_of(module, table)}) imports {used} (floor {floor_of(used, table)})"
            for module, path in sorted(modules.items()) for used in sorted(imports(path))
            if floor_of(used, table) > floor_of(module, table)]


def circle(modules: dict[str, object]) -> tuple | None:
    """An import circle among `modules`, or None."""
    graph = {module: {used for used in imports(path) if used != module} for module, path in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def test_every_import_reaches_its_own_floor_or_one_below():
    table = floors()
    assert {"empo2.method", "empo2.analysis", "empo2.llm", "empo2.envs"} <= set(table)
    upward = upward_imports(MODULES, table)
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    assert circle(MODULES) is None


def test_the_checks_catch_an_upward_import_and_a_circle(tmp_path):
    """The checks can fail: a lazy import of the report inside the trainer is an upward import, and the
    trainer importing the rollout that imports the trainer is a circle."""
    trainer, rollout = tmp_path / "trainer.py", tmp_path / "rollout.py"
    trainer.write_text("def f():\n    from empo2.analysis import report\n")
    assert upward_imports({**MODULES, "empo2.method.trainer": trainer}, floors()) == [
        "empo2.method.trainer (floor 4) imports empo2.analysis.report (floor 5)"]
    trainer.write_text("from empo2.method import rollout\n")
    rollout.write_text("from empo2.method.trainer import Trainer\n")
    found = circle({**MODULES, "empo2.method.trainer": trainer, "empo2.method.rollout": rollout})
    assert set(found) == {"empo2.method.trainer", "empo2.method.rollout"}
