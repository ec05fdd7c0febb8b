"""The import graph of the project's own code, read from the source (every import counts: at
module level, inside a function, and under ``TYPE_CHECKING``, since a type-only import is still
a dependency a reader must hold)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("policies", "proxy", "replay")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def imported_names(source: str, filename: str = "<source>") -> set[str]:
    """Every absolute import of ``source``: ``from a.b import c`` gives ``a.b`` and ``a.b.c``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def internal_imports(path: Path) -> set[str]:
    """The project's modules that the module at ``path`` imports."""
    known = modules()
    return {name for name in imported_names(path.read_text(), str(path)) if name in known}


def graph() -> dict[str, set[str]]:
    return {name: {m for m in internal_imports(path) if m != name} for name, path in modules().items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk meets (an empty list: the graph is acyclic)."""
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    return found


def proxy_packages() -> list[str]:
    """``proxy``'s packages (``proxy.route``, ...), each a folder with an ``__init__.py``."""
    return sorted(f"proxy.{d.name}" for d in (ROOT / "proxy").iterdir() if (d / "__init__.py").is_file())


def unit_of(module: str, packages: Iterable[str]) -> str:
    """The unit a module belongs to for the package rules: its ``proxy`` package, a root module
    of ``proxy`` by its own name (``proxy.app``), or the top package (``policies``, ``replay``)."""
    for package in packages:
        if module == package or module.startswith(package + "."):
            return package
    if module.startswith("proxy"):
        return module
    return module.split(".")[0]


def unit_edges() -> dict[str, dict[str, set[str]]]:
    """unit -> imported unit -> the module imports behind that arrow."""
    packages = proxy_packages()
    edges: dict[str, dict[str, set[str]]] = {}
    for module, targets in graph().items():
        source = unit_of(module, packages)
        for target in targets:
            unit = unit_of(target, packages)
            if unit != source:
                edges.setdefault(source, {}).setdefault(unit, set()).add(f"{module} -> {target}")
    return edges
