"""The SMAC modules import one way only: types <- backends <- factory <- env (no cycle).

Read from the source (every ``import``, also those inside functions), so a lazy import that
closes a circle fails here too, not only one that breaks at import time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rllib_ext.envs.smac as smac_package
from tests.test_import_graph import find_cycle

PACKAGE = "rllib_ext.envs.smac"
ROOT = Path(smac_package.__file__).parent
MODULES = {path.stem: path for path in ROOT.glob("*.py")}


def _imports(path: Path) -> set[str]:
    """Modules of this package that ``path`` imports (``__init__`` for names from the package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            if module == PACKAGE:
                for alias in node.names:
                    found.add(alias.name if alias.name in MODULES else "__init__")
            elif module.startswith(PACKAGE + "."):
                found.add(module.removeprefix(PACKAGE + ".").split(".")[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE + "."):
                    found.add(alias.name.removeprefix(PACKAGE + ".").split(".")[0])
    found.discard(path.stem)
    return found & MODULES.keys()


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def test_no_import_cycle_between_smac_modules():
    cycle = find_cycle(GRAPH)
    assert cycle is None, " -> ".join(cycle or [])


def test_backend_types_import_no_backend_and_no_factory():
    assert GRAPH["backend"] <= {"settings"}
    assert "factory" not in GRAPH["sc2"] | GRAPH["smax"]
    assert {"sc2", "smax", "backend"} <= GRAPH["factory"]


def test_the_graph_reader_sees_lazy_imports(tmp_path):
    """Guards the test itself: a function-level import is an edge, a package name is __init__."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        f"def f():\n    from {PACKAGE} import sc2, SMACEnv\n    import {PACKAGE}.smax\n"
    )
    assert _imports(probe) == {"sc2", "smax", "__init__"}
