"""``policies/`` is pure (it never imports the HTTP edge, the server, metrics or the proxy); the
project's module graph has no cycle; ``serve`` never loads the replay harness."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from tests.module_graph import ROOT, cycles, graph, imported_names, internal_imports, module_name

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


def test_imports_inside_functions_and_type_checking_blocks_are_counted(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from proxy.parts import AppParts\n"
        "def late() -> None:\n    from proxy.app import create_app\n"
    )
    names = imported_names(module.read_text())
    assert {"proxy.parts", "proxy.parts.AppParts", "proxy.app", "proxy.app.create_app"} <= names


def test_the_module_graph_has_no_cycle() -> None:
    """No cycle, type-only imports included: a ``TYPE_CHECKING`` import is still a dependency a
    reader must hold."""
    assert cycles(graph()) == []


def test_a_cycle_through_a_type_only_import_is_found() -> None:
    edges = {"proxy.app": {"proxy.lifecycle"}, "proxy.lifecycle": {"proxy.app"}}
    assert cycles(edges) == [["proxy.app", "proxy.lifecycle", "proxy.app"]]


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
