"""Imports go downwards (docs/architecture.md): every fedac module sits in one layer, imports only
from its own layer or lower ones, and no set of modules imports itself in a circle. Read with `ast`
only, so the check sees function-level (lazy) imports as well as module-level ones, and needs no
import of fedac."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: Lowest layer first: (name, module prefixes). The one place the direction is declared.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # the shared ground at the package root, and settings/ (no torch, read by config)
    (
        "core",
        (
            "fedac",
            "fedac.errors",
            "fedac.seeding",
            "fedac.fields",
            "fedac.registry",
            "fedac.config",
            "fedac.version",
            "fedac.progress",
            "fedac.settings",
        ),
    ),
    ("data", ("fedac.data",)),
    ("models", ("fedac.models", "fedac.kernels")),
    ("training", ("fedac.training",)),
    ("rules", ("fedac.rules",)),
    ("algorithms", ("fedac.algorithms",)),
    ("engine", ("fedac.engine",)),
    ("flower", ("fedac.flower",)),
    # the papers' tables and their commands: nothing below imports them
    ("experiments", ("fedac.experiments",)),
    # a run's model taken to a device (export, predict, stream): reads runs, below the CLI only
    ("export", ("fedac.export",)),
    ("cli", ("fedac.cli", "fedac.__main__")),
]


def module_files() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "fedac").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def layer_of(module: str) -> int | None:
    """The layer of the longest declared prefix that names `module` or a package above it."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def imports(module: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """Every fedac module that `module` imports, anywhere in the file: (imported module, line)."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [
                (alias.name, node.lineno)
                for alias in node.names
                if alias.name.split(".")[0] == "fedac"
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb from the importing package
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "fedac":
                continue
            # `from fedac.x import y` imports the module fedac.x.y when y is one
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in known else target, node.lineno))
    # A module importing its own package's face (e.g. `from fedac.data import x` inside
    # fedac.data.*) is the parent package, a different module; only the module itself is dropped.
    return [(name, line) for name, line in found if name != module]


def import_graph() -> tuple[dict[str, Path], dict[str, list[tuple[str, int]]]]:
    files = module_files()
    known = set(files)
    graph = {}
    for module, path in files.items():
        graph[module] = [
            (target if target in known else _owner(target, known), line)
            for target, line in imports(module, path, known)
        ]
    return files, graph


def _owner(name: str, known: set[str]) -> str:
    """The nearest known module above a dotted name (an attribute import of a module that is not a
    file)."""
    while name not in known and "." in name:
        name = name.rpartition(".")[0]
    return name


def find_cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _ in graph.get(node, []):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_every_module_has_a_layer():
    files, _ = import_graph()
    orphans = [module for module in files if layer_of(module) is None]
    assert not orphans, (
        f"modules in no layer of LAYERS (add their prefix where they belong): {orphans}"
    )


def test_imports_go_downwards():
    files, graph = import_graph()
    upward = []
    for module, targets in graph.items():
        here = layer_of(module)
        for target, line in targets:
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                upward.append(
                    f"{files[module].relative_to(SRC)}:{line}: {module} ({LAYERS[here][0]}) "
                    f"imports {target} ({LAYERS[there][0]})"
                )
    assert not upward, "imports that climb a layer:\n" + "\n".join(upward)


def test_no_import_cycles():
    _, graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "modules that import each other in a circle:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_the_checker_sees_lazy_relative_and_submodule_imports(tmp_path):
    """The graph reader itself: a lazy import, a relative one and `from pkg import submodule` all
    count."""
    pkg = tmp_path / "fedac" / "engine"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sim.py").write_text("def f():\n    from fedac.algorithms import base\n")
    (pkg / "rel.py").write_text("from . import sim\nfrom .sim import f\n")
    known = {
        "fedac.engine",
        "fedac.engine.sim",
        "fedac.engine.rel",
        "fedac.algorithms",
        "fedac.algorithms.base",
    }
    assert imports("fedac.engine.sim", pkg / "sim.py", known) == [("fedac.algorithms.base", 2)]
    assert imports("fedac.engine.rel", pkg / "rel.py", known) == [
        ("fedac.engine.sim", 1),
        ("fedac.engine.sim", 2),
    ]
    graph = {"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": [("a", 1)]}
    assert find_cycles(graph) == [["a", "b", "c"]]


def test_the_package_root_holds_only_the_shared_ground():
    """Issue 58: no lobby of loose modules. A module at src/fedac/ belongs in a package (rules/,
    training/, engine/, ...) unless it is ground every layer shares; a new one here fails until it
    moves."""
    root = sorted(path.stem for path in (SRC / "fedac").glob("*.py") if path.stem != "__init__")
    assert root == [
        "__main__",
        "cli",
        "config",
        "errors",
        "fields",
        "progress",  # every progress bar (data's syntheses and caches, the engine's rounds, cli)
        "registry",
        "seeding",
        "version",
    ], root
