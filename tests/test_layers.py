"""The floors of the house: transports never import mesh, and executor imports neither.

The wire vocabulary (transports/wire/) is the floor every layer stands on; the executor is the boundary under it.
An import upward would make a cycle between packages again (issue 22 found 27 edges from transports into mesh), so
this reads every import statement of the two lower packages, at any depth (a lazy import inside a function counts),
and every `importlib.import_module` of a literal name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# package -> the packages it must never import
FORBIDDEN = {
    "transports": ("mesh",),
    "executor": ("mesh", "transports"),
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def upward_imports(package: str) -> list[str]:
    banned = FORBIDDEN[package]
    problems = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, module in imported_modules(path):
            if module.split(".")[0] in banned:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return problems


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_lower_floor_never_imports_a_higher_one(package: str) -> None:
    assert upward_imports(package) == []


def test_the_rule_sees_a_lazy_import_inside_a_function(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n    from mesh.node import MeshNode\n    import importlib\n    importlib.import_module('mesh.cli')\n"
    )
    assert [m for _, m in imported_modules(probe)] == ["mesh.node", "importlib", "mesh.cli"]
