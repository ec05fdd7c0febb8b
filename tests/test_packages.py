"""``proxy/`` as packages whose names draw the path of a request, each with a README that says
what it may import and who imports it; the README is the rule and this test holds the code to it.

- Every package of ``proxy`` (and ``policies``, ``replay``) has a README with a ``May import:``
  and an ``Imported by:`` line.
- What a package's modules import of the project (type-only imports and imports inside
  functions included) is within its ``May import:`` list, and ``Imported by:`` names exactly who
  imports it, so a README can neither allow nor describe a dependency the code does not have.
- The allowed arrows between packages have no cycle: the packages are layers, and no package
  imports the root modules (the app factory, the object graph, the CLI).
- Sizes: at most 12 modules at ``proxy/``'s top, none over 400 lines, no function over 80.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.module_graph import ROOT, cycles, modules, proxy_packages, unit_edges

NAME = re.compile(r"`([a-z_.]+)`")
ROOT_MODULES = {"proxy", "proxy.app", "proxy.parts", "proxy.cli", "proxy.lifecycle", "proxy.serving"}


def readme_rule(package: str, label: str) -> set[str]:
    path = ROOT / package.replace(".", "/") / "README.md"
    assert path.is_file(), f"{package} has no README.md"
    lines = [line for line in path.read_text().splitlines() if line.startswith(f"- {label}:")]
    assert len(lines) == 1, f"{path.relative_to(ROOT)}: one line '- {label}: ...' expected"
    return set(NAME.findall(lines[0]))


def importers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for source, targets in unit_edges().items():
        for target in targets:
            found.setdefault(target, set()).add(source)
    return found


@pytest.mark.parametrize("package", [*proxy_packages(), "policies", "replay"])
def test_a_package_imports_only_what_its_readme_allows(package: str) -> None:
    allowed = readme_rule(package, "May import")
    actual = unit_edges().get(package, {})
    offenders = {unit: sorted(arrows) for unit, arrows in actual.items() if unit not in allowed}
    assert offenders == {}, f"{package} imports what its README does not allow"
    assert allowed == set(actual), f"{package}/README.md allows imports it does not have"


@pytest.mark.parametrize("package", [*proxy_packages(), "policies", "replay"])
def test_a_readme_names_exactly_who_imports_its_package(package: str) -> None:
    assert readme_rule(package, "Imported by") == importers().get(package, set())


def test_the_allowed_arrows_between_packages_have_no_cycle() -> None:
    allowed = {package: readme_rule(package, "May import") for package in proxy_packages()}
    assert cycles(allowed) == []
    reaching_the_root = {package: sorted(rule & ROOT_MODULES) for package, rule in allowed.items()}
    assert {package: names for package, names in reaching_the_root.items() if names} == {}


def test_the_rule_would_catch_a_package_importing_a_layer_above_it() -> None:
    allowed = {package: readme_rule(package, "May import") for package in proxy_packages()}
    allowed["proxy.state"] = allowed["proxy.state"] | {"proxy.route"}
    assert cycles(allowed) != []


def test_the_top_readme_maps_every_package() -> None:
    text = (ROOT / "proxy" / "README.md").read_text()
    missing = [p for p in proxy_packages() if f"`{p.split('.')[1]}/`" not in text]
    assert missing == []


def test_the_proxy_top_level_holds_few_modules() -> None:
    top = sorted(p.name for p in (ROOT / "proxy").glob("*.py"))
    assert len(top) <= 12, top


def function_lengths(path: Path) -> dict[str, int]:
    tree = ast.parse(path.read_text(), str(path))
    return {
        f"{node.name}:{node.lineno}": node.end_lineno - node.lineno + 1  # type: ignore[operator]
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def test_no_module_over_400_lines_and_no_function_over_80() -> None:
    long_modules = {}
    long_functions = {}
    for name, path in modules().items():
        lines = len(path.read_text().splitlines())
        if lines > 400:
            long_modules[name] = lines
        long_functions.update({f"{name}.{f}": n for f, n in function_lengths(path).items() if n > 80})
    assert long_modules == {}
    assert long_functions == {}
