"""rllib_ext's import graph: no cycle, and every import points down the layers of ARCHITECTURE.md.

Read from the source with ``ast``: every ``import``, also those inside functions, so a lazy
import that closes a circle fails here like one that breaks at import time (``if
TYPE_CHECKING:`` blocks never run and are left out). Importing ``a.b.c`` runs the packages
``a.b`` on the way, so those count too (not the importer's own packages, nor the root
``rllib_ext``, the lazy facade every import passes). Nothing is imported.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import rllib_ext

PACKAGE = "rllib_ext"
ROOT = Path(rllib_ext.__file__).parent

Graph = dict[str, dict[str, int]]
"""module -> {imported module: line of the first such import}."""

# Layers, top to bottom (ARCHITECTURE.md's map, the design's "Layout"): an import goes to the
# same layer or one below. Names are the units under rllib_ext (a subpackage or a module).
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"cli"}),  # the command: on top, nothing imports it
    frozenset(
        {"", "config", "compat", "tune", "profiling", "smac_config", "runner_table", "testing"}
    ),
    # RLlib adapters; config_checks is here because the learner calls it (stock-config route).
    frozenset(
        {"learners", "env_runners", "envs", "modules", "connectors", "config_checks"}
        | {"callbacks", "sampling_protocol", "fused", "fused_sampling", "amp_choice"}
    ),
    frozenset({"distributed"}),  # DDP hooks that move bytes
    frozenset({"ops"}),  # kernels: numpy/numba/torch, no Ray
    frozenset({"settings", "_validation"}),
    frozenset({"_rllib_private", "_private_names", "_private_check", "_versions", "_threads"}),
)

# -- reading the graph --------------------------------------------------------------------------


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _runtime_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _named(name: str, modules: Mapping[str, Path]) -> str | None:
    """The module ``name`` is, or the innermost module (package) holding it."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> dict[str, int]:
    """The modules of ``modules`` that ``module`` (its source at ``path``) names in an import.

    ``from pkg import name`` is the submodule ``pkg.name`` when there is one, else ``pkg``.
    """
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    explicit: dict[str, int] = {}
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
            targets = [t if t in modules else base for t in targets]
        else:
            continue
        for target in targets:
            named = _named(target, modules)
            if named is not None and named != module:
                explicit.setdefault(named, node.lineno)
    return explicit


def _on_the_way(module: str, imported: Mapping[str, int], modules: Iterable[str]) -> dict[str, int]:
    """``imported`` plus the packages importing them runs (not the root, nor ``module``'s own)."""
    own = {module.rsplit(".", i)[0] for i in range(module.count(".") + 1)}
    found = dict(imported)
    for target, line in imported.items():
        parts = target.split(".")
        for i in range(2, len(parts)):
            parent = ".".join(parts[:i])
            if parent in modules and parent not in own:
                found.setdefault(parent, line)
    return found


def import_graph(root: Path, package: str, *, leave_out: Iterable[tuple[str, str]] = ()) -> Graph:
    """Every module's imports, without the named ``(importer, imported)`` imports."""
    modules = module_files(root, package)
    skip = set(leave_out)
    graph = {}
    for name, path in modules.items():
        named = {b: n for b, n in imports_of(name, path, modules).items() if (name, b) not in skip}
        graph[name] = _on_the_way(name, named, modules)
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return None


def unit(module: str) -> str:
    """The unit under rllib_ext a module belongs to (``""`` for the root package)."""
    return module.split(".")[1] if "." in module else ""


def _layer(name: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


GRAPH = import_graph(ROOT, PACKAGE)
CHECKED = GRAPH


def _violations(allowed: Mapping[str, Iterable[str]]) -> list[str]:
    """Imports from a unit of ``allowed`` to a unit outside its allowed set (plus itself)."""
    bad = []
    for a, deps in CHECKED.items():
        if unit(a) in allowed:
            ok = {unit(a), *allowed[unit(a)]}
            bad += [f"{a} -> {b} (line {n})" for b, n in deps.items() if unit(b) not in ok]
    return bad


# -- the rules ----------------------------------------------------------------------------------


def test_no_import_cycle_between_modules():
    cycle = find_cycle(CHECKED)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_cycle_between_subpackages():
    """Between units (``modules`` <-> ``connectors`` through one key was such a cycle)."""
    units: dict[str, set[str]] = {}
    for a, deps in CHECKED.items():
        if unit(a):
            units.setdefault(unit(a), set()).update(unit(b) for b in deps if unit(b) != unit(a))
    cycle = find_cycle({a: deps - {""} for a, deps in units.items()})
    assert cycle is None, "subpackage cycle: " + " -> ".join(cycle or [])


def test_every_unit_has_a_layer():
    units = {unit(m) for m in GRAPH}
    missing = sorted(units - set().union(*LAYERS))
    assert not missing, f"add {missing} to LAYERS in {Path(__file__).name}"


def test_imports_point_down_the_layers():
    up = [
        f"{a} -> {b} (line {line})"
        for a, deps in CHECKED.items()
        for b, line in deps.items()
        if _layer(unit(a)) > _layer(unit(b))
    ]
    assert not up, "imports up a layer (move the shared name down):\n" + "\n".join(up)


def test_ops_imports_nothing_of_ours_outside_ops():
    assert not _violations({"ops": ()})


def test_distributed_imports_only_ops_and_the_settings():
    assert not _violations({"distributed": ("ops", "settings", "_validation")})


def test_nothing_outside_the_cli_imports_it():
    into_cli = [
        f"{a} -> {b} (line {line})"
        for a, deps in CHECKED.items()
        for b, line in deps.items()
        if unit(b) == "cli" and unit(a) != "cli"
    ]
    assert not into_cli, into_cli


def test_the_base_modules_import_only_each_other():
    base = ("_rllib_private", "_private_names", "_private_check", "_versions", "_validation")
    base += ("settings",)
    assert not _violations({name: base for name in base})


_LAZY = re.compile(r"#\s*lazy:")


def test_every_function_level_import_says_why_it_is_lazy():
    """The one reason to import inside a function: keep Ray/torch/JAX (or an optional
    dependency) out of ``--help`` / ``import rllib_ext``; the comment (``# lazy: ...``, on the
    line or right above the block of imports) says which. Anything else goes to the top."""
    silent: set[str] = set()  # a set: nested functions are walked twice
    for path in module_files(ROOT, PACKAGE).values():
        text = path.read_text()
        lines, tree = text.splitlines(), ast.parse(text)
        spans = _import_spans(tree)
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    if not _says_why(lines, spans, node.lineno):
                        silent.add(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not silent, "function-level imports without '# lazy: <why>':\n" + "\n".join(
        sorted(silent)
    )


def _import_spans(tree: ast.AST) -> dict[int, int]:
    """First line -> last line of every import statement of ``tree``."""
    return {
        n.lineno: n.end_lineno or n.lineno
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }


def _says_why(lines: list[str], spans: Mapping[int, int], line: int) -> bool:
    """``# lazy:`` on the import's lines, or on the comment line right above its block (the
    imports and blank lines before it)."""
    if any(_LAZY.search(lines[i - 1]) for i in range(line, spans[line] + 1)):
        return True
    inside = {i: start for start, end in spans.items() for i in range(start, end + 1)}
    i = line - 1
    while i >= 1 and (i in inside or not lines[i - 1].strip()):
        i = inside.get(i, i) - 1
    return i >= 1 and bool(_LAZY.match(lines[i - 1].strip()))


# -- the reader and the finder themselves -------------------------------------------------------


def _fake_package(tmp_path: Path, files: Mapping[str, str]) -> Path:
    root = tmp_path / "fakepkg"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_cycle_closed_by_a_lazy_import_is_found(tmp_path):
    root = _fake_package(
        tmp_path,
        {
            "a.py": "from fakepkg import b\n",
            "b.py": "def f():\n    from fakepkg.a import thing\n    return thing\n",
            "c.py": "import fakepkg.a\n",
        },
    )
    graph = import_graph(root, "fakepkg")
    assert graph["fakepkg.a"] == {"fakepkg.b": 1}
    assert graph["fakepkg.b"] == {"fakepkg.a": 2}
    assert find_cycle(graph) == ["fakepkg.a", "fakepkg.b", "fakepkg.a"]
    del graph["fakepkg.b"]["fakepkg.a"]
    assert find_cycle(graph) is None


def test_the_reader_sees_packages_on_the_way_and_skips_type_checking(tmp_path):
    root = _fake_package(
        tmp_path,
        {
            "sub/__init__.py": "from fakepkg.sub import deep\n",
            "sub/deep.py": "from . import sibling\nfrom .. import top\n",
            "sub/sibling.py": "",
            "top.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from fakepkg.sub import deep\n"
                "def g():\n    from fakepkg.sub.deep import x\n"
            ),
        },
    )
    graph = import_graph(root, "fakepkg")
    assert graph["fakepkg.top"] == {"fakepkg.sub.deep": 5, "fakepkg.sub": 5}
    assert graph["fakepkg.sub.deep"] == {"fakepkg.sub.sibling": 1, "fakepkg.top": 2}
    assert graph["fakepkg.sub"] == {"fakepkg.sub.deep": 1}
    # top -> sub (its __init__) -> deep -> top: importing top first would run in circles.
    assert find_cycle(graph) == ["fakepkg.sub", "fakepkg.sub.deep", "fakepkg.top", "fakepkg.sub"]


def test_the_comment_check_accepts_a_commented_block(tmp_path):
    text = (
        "def f():\n"
        "    # lazy: keeps Ray out of --help\n"
        "    import ray\n"
        "    from ray.rllib import (\n        core,\n    )\n\n"
        "    from rllib_ext import settings\n"
        "    x = 1\n"
        "    import torch\n"
    )
    lines, spans = text.splitlines(), _import_spans(ast.parse(text))
    assert [_says_why(lines, spans, n) for n in (3, 4, 8, 10)] == [True, True, True, False]
