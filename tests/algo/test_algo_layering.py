"""ardea.algo imports only torch, the standard library and ardea's two leaf modules (errors,
registry: they import nothing of ardea's layers); ardea.config never imports algo."""

import ast
import subprocess
import sys
from pathlib import Path

import ardea.algo
import ardea.config.ppo

ALGO = Path(ardea.algo.__file__).parent
LEAVES = ("from ardea.algo", "import ardea.algo", "from ardea.registry ", "from ardea.errors ")


def imported_roots(path):
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_algo_imports_only_torch_stdlib_itself_and_the_leaf_modules():
    for path in ALGO.glob("*.py"):
        for root in imported_roots(path):
            assert root in {"torch", "ardea", "__future__"} or root in sys.stdlib_module_names, (
                path,
                root,
            )
        source = path.read_text()
        for line in source.splitlines():
            if line.startswith(("import ardea", "from ardea")):
                assert line.startswith(LEAVES), (path, line)


def test_config_does_not_import_algo():
    assert "ardea.algo" not in imported_roots(Path(ardea.config.ppo.__file__)) | {
        node.module
        for node in ast.walk(ast.parse(Path(ardea.config.ppo.__file__).read_text()))
        if isinstance(node, ast.ImportFrom) and node.module
    }
    code = "import sys, ardea.config.ppo; print('ardea.algo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_config_offers_exactly_the_algorithms_choices():
    """The two layers may not import each other, so each keeps its tuple: they must agree."""
    from ardea.algo import AGG_MODES, KL_ESTIMATORS, NORM_MODES
    from ardea.algo.lambda_fn import TIMESTEP_UNITS

    assert ardea.config.ppo.LOSS_AGG_MODES == AGG_MODES
    assert ardea.config.ppo.KL_ESTIMATORS == KL_ESTIMATORS
    assert ardea.config.ppo.NORM_MODES == NORM_MODES
    assert ardea.config.ppo.TIMESTEP_UNITS == TIMESTEP_UNITS
    from ardea.algo.mismatch import CORRECTION_MODES
    from ardea.config.mismatch import MISMATCH_MODES

    assert MISMATCH_MODES == ("none", *CORRECTION_MODES)
