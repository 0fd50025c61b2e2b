"""DESIGN.md's layering: a module imports only from its own layer or the layers below."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "src" / "ardea"
# DESIGN.md, bottom to top; packages on one line share a layer.
LAYERS = [
    {"errors", "registry", "__init__"},
    {"config"},
    {"algo"},
    {"model"},
    {"data", "reward"},
    {"rollout", "agent"},
    {"trainer"},
    {"service"},
    {"cli"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def top_level(module_path: Path) -> str:
    parts = module_path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def imported_layers(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "ardea" and len(parts) > 1:
                found.add(parts[1])
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if top_level(p) in RANK)


def test_every_package_has_a_layer():
    assert {top_level(p) for p in PACKAGE.rglob("*.py")} <= set(RANK)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = RANK[top_level(path)]
    upward = {layer for layer in imported_layers(path) if RANK.get(layer, -1) > own}
    assert not upward, f"{path.relative_to(PACKAGE)} imports higher layers {sorted(upward)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path):
    """One idea per module (under 400 lines) and per function (at most 60 lines)."""
    source = path.read_text(encoding="utf-8")
    assert len(source.splitlines()) < 400, f"{path.relative_to(PACKAGE)} has grown past 400 lines"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = node.end_lineno - node.lineno + 1
            assert length <= 60, f"{path.relative_to(PACKAGE)}: {node.name} has {length} lines"
