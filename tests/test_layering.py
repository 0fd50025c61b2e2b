"""DESIGN.md's layering: a module imports only from its own layer or the layers below, and
no modules import each other in a loop."""

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "src" / "ardea"
# DESIGN.md, bottom to top, as strict as the code is: each package may import only the
# packages listed before it (the first line's modules are shared by every layer).
LAYERS = [
    {"errors", "registry", "timing", "__init__"},
    {"config"},
    {"algo"},
    {"model"},
    {"data"},
    {"reward"},
    {"rollout"},
    {"agent"},
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


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The ardea modules ``path`` imports when it runs (at import or in a function), an
    ``import`` under ``if TYPE_CHECKING`` left out; ``from package import name`` is the
    module ``package.name`` when there is one, else the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & modules


def test_no_import_cycle():
    """No loop of modules importing each other, even through an import inside a function
    (the usual way a loop is hidden): each would be one module's idea split in two."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: runtime_imports(path, set(paths)) - {name} for name, path in paths.items()}
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                cycles.append(" -> ".join([*trail[trail.index(other) :], other]))
            elif other not in state:
                visit(other, [*trail, other])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
