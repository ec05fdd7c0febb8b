"""``policies/`` is pure: it never imports the HTTP edge, the server, metrics or the proxy."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"litestar", "httpx", "aiohttp", "prometheus_client", "proxy", "uvicorn", "replay"}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_policies_import_no_io_layers() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & FORBIDDEN)
        for path in (ROOT / "policies").rglob("*.py")
        if imported_roots(path) & FORBIDDEN
    }
    assert offenders == {}


def test_layering_check_would_catch_an_offender(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import httpx\nfrom proxy.app import create_app\n")
    assert imported_roots(bad) & FORBIDDEN == {"httpx", "proxy"}


# --- the module graph ------------------------------------------------------------------------

PACKAGES = ("policies", "proxy", "replay")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def internal_imports(path: Path) -> set[str]:
    """Internal modules a module imports, at module level or inside functions (a cycle must not
    hide behind an import in a function); only ``TYPE_CHECKING`` blocks are left out."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.add(child.module)
                found.update(f"{child.module}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {name for name in found if name.split(".")[0] in PACKAGES}


def test_imports_inside_functions_are_counted(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def late() -> None:\n    from proxy.app import create_app\n")
    assert internal_imports(module) == {"proxy.app", "proxy.app.create_app"}


def test_the_module_graph_has_no_cycle() -> None:
    modules = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph = {
        name: {m for m in internal_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_proxy_never_imports_the_replay_harness() -> None:
    offenders = {
        module_name(path): sorted(m for m in internal_imports(path) if m.split(".")[0] == "replay")
        for path in (ROOT / "proxy").rglob("*.py")
        if any(m.split(".")[0] == "replay" for m in internal_imports(path))
    }
    assert offenders == {}


def test_serve_never_loads_the_replay_harness(tmp_path: Path) -> None:
    """`compaction-proxy serve` builds the whole app (uvicorn's run stubbed) without importing
    a single module of the replay harness: its command is registered by name only."""
    script = (
        "import sys, uvicorn\n"
        "uvicorn.run = lambda target, **kw: None\n"
        "from proxy.cli import main\n"
        "code = main(['serve', '--port', '0'])\n"
        "loaded = sorted(m for m in sys.modules if m == 'replay' or m.startswith('replay.'))\n"
        "print(code, loaded)\n"
    )
    env = {**os.environ, "COMPACTION_PROXY_CONFIG": ""}
    env.pop("COMPACTION_PROXY_CONFIG")
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=True,
    )
    assert result.stdout.strip().splitlines()[-1] == "0 []", result.stdout + result.stderr
