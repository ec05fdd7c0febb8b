"""The documentation's commands run as written, in order, as a newcomer would type them.

The README and every page of the documentation site (``docs/**/*.md``) are checked. Every
```bash and ```python block carries a marker on the line before it: ``<!-- readme-test: run -->``
(run now, must exit 0), ``<!-- readme-test: serve -->`` (a long-running ``serve``: started in
the background, stopped at the next one or at the end of the page) or
``<!-- readme-test: skip: <why> -->`` (it needs what a test cannot have: a real key, Docker, an
agent CLI, the model server). Each page's blocks run in order in a scratch copy of what they use
(``doc_pages.COPIED``), with a local fake upstream instead of api.openai.com: one test per page.
What differs from a newcomer's shell, and why:

- the install step (``python3 -m venv .venv && .venv/bin/pip install ...``) is taken off the
  front of a block and ``.venv`` is this test's own environment: CI runs the README's install
  and test command itself, and tests do not download packages;
- ports 8080 and 9000 become free loopback ports, and ``--host 0.0.0.0`` becomes 127.0.0.1
  (tests listen and connect on loopback only);
- the environment names the fake upstream (``COMPACTION_PROXY_UPSTREAM_URL``) and a test key,
  and ``XDG_STATE_HOME`` is in the scratch directory.

Some pages' outputs are checked beyond their exit status (``CHECKS``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from tests.e2e.doc_pages import UNCHECKED_FENCE, Sandbox, page_blocks, page_text, pages
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.e2e

PAGES = pages()


def test_every_shell_and_python_block_says_whether_it_runs() -> None:
    assert "README.md" in PAGES and len(PAGES) >= 30, PAGES
    markers: list[str] = []
    for page in PAGES:
        assert not UNCHECKED_FENCE.search(page_text(page)), (
            f"{page}: write commands in ```bash or ```python blocks, so that they are run"
        )
        for block in page_blocks(page):
            assert block.marker == "run" or block.marker == "serve" or block.marker.startswith("skip: "), (
                f"{page} line {block.line}: mark the block with <!-- readme-test: run|serve|skip: why -->"
            )
            markers.append(block.marker)
    assert len(page_blocks("README.md")) >= 6
    assert len(markers) >= 40
    assert markers.count("run") >= 20, "skip only what a test cannot have"


@pytest.fixture
def sandbox(tmp_path: Path, upstream: FakeUpstream) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path, upstream)
    yield box
    box.stop()


def first_compacted_request(box: Sandbox, printed: str) -> None:
    """The headers say what the upstream received, and the event is found by its session id."""
    lines = [line for line in printed.splitlines() if line.lower().startswith("x-compaction")]
    headers = dict(line.lower().split(": ", 1) for line in lines)
    assert headers["x-compaction-policy"].strip() == "n_latest_10"
    assert int(headers["x-compaction-tokens-after"]) < int(headers["x-compaction-tokens-before"])


def event_read_back(box: Sandbox, printed: str) -> None:
    first_compacted_request(box, printed)
    # The event, as a table row: the client's session id and the policy.
    assert any("first-hour" in line and "n_latest_10" in line for line in printed.splitlines())


def starter_config(box: Sandbox, printed: str) -> None:
    assert "effective policies (default: improved" in printed
    # The verdict, last (no warning: the local fake's model windows are learned from it).
    assert "\nOK: config.starter.yml is valid:" in printed


def started_line(box: Sandbox) -> None:
    """The start line of the first ``serve`` says where it listens, forwards, what it applies."""
    first_log = sorted(box.directory.glob("serve_*.log"), key=lambda p: int(p.stem.split("_")[1]))[0]
    started = next(orjson.loads(line) for line in first_log.read_text().splitlines() if '"started"' in line)
    assert started["listen"] == f"http://127.0.0.1:{box.ports['8080']}"
    assert started["upstream"] == box.env["COMPACTION_PROXY_UPSTREAM_URL"]
    assert (started["policy"], started["mode"]) == ("improved", "enforce")
    assert started["store"] == "sqlite var/compaction.db" and started["version"]


def readme(box: Sandbox, printed: str) -> None:
    event_read_back(box, printed)
    starter_config(box, printed)
    assert "ChatCompletion(" in printed  # the SDK's answer, through the proxy
    started_line(box)


def first_request(box: Sandbox, printed: str) -> None:
    event_read_back(box, printed)
    starter_config(box, printed)


def install(box: Sandbox, printed: str) -> None:
    assert '{"status":"ok"}' in printed
    started_line(box)


def demo(box: Sandbox, printed: str) -> None:
    """The demo compacts with no key and no config: the headers of a point, its event row, the
    read, and the session page's link (the sandbox's upstream variables are not read)."""
    assert "x-compaction-trigger: threshold" in printed
    assert re.search(r"^  \d\d:\d\d:\d\d\.\d{3}  threshold ", printed, re.M), printed
    assert "read_tool_output(" in printed and "HTTP 400 context_length_exceeded" in printed
    assert re.search(r"Session page: http://127\.0\.0\.1:\d+/ui#session=s_", printed)


def requests_page(box: Sandbox, printed: str) -> None:
    assert "fake-model" in printed  # /v1/models, relayed from the upstream
    assert '"openapi"' in printed


def chat_door(box: Sandbox, printed: str) -> None:
    assert printed.rstrip().endswith("data: [DONE]")


def configuration(box: Sandbox, printed: str) -> None:
    assert "lean" in printed  # the starter file's own policy, among the effective ones
    # check-config's verdict; the fake upstream's names are the user's to add, hence a warning.
    assert "\nOK: my.yml is valid: policy improved in enforce mode;" in printed
    assert "\nserver:\n" in printed and "admin_token: null" in printed  # --full, secrets hidden
    assert '{"status":"ok"}' in printed  # the proxy started on port 9000 answers


def events(box: Sandbox, printed: str) -> None:
    assert '"policy":"n_latest_10"' in printed
    # `events --table` through a pipe: the header, then the request sent as first-hour.
    assert "TOKENS BEFORE -> AFTER  READS  OFFLOADED" in printed
    assert any(line[16:].startswith("first-hour ") for line in printed.splitlines())
    assert '"door":"chat"' in printed  # the sessions API


def shadow(box: Sandbox, printed: str) -> None:
    assert "x-compaction-mode: shadow" in printed.lower()


def session_page(box: Sandbox, printed: str) -> None:
    assert printed.startswith("200 text/html")


def metrics(box: Sandbox, printed: str) -> None:
    assert 'compaction_proxy_tokens_saved_total{mode="enforce",policy="n_latest_10"}' in printed


def wrap(box: Sandbox, printed: str) -> None:
    # The base URL carries the run's session (/s/<session>/v1), which the proxy takes as X-Session-Id.
    assert f"base URL http://127.0.0.1:{box.ports['8080']}/s/wrap-" in printed
    session = printed.split("session ")[1].split()[0]
    assert f"/s/{session}/v1, session {session}" in printed


def replay(box: Sandbox, printed: str) -> None:
    assert (box.directory / "replay-demo" / "report.html").exists()
    assert (box.directory / "runs" / "r1" / "results.json").exists()


def replay_tools(box: Sandbox, printed: str) -> None:
    assert (box.directory / "injected.jsonl").exists()
    assert (box.directory / "runs" / "state" / "results.json").exists()
    assert (box.directory / "runs" / "tune" / "winner.yml").exists()


CHECKS: dict[str, Callable[[Sandbox, str], None]] = {
    "README.md": readme,
    "docs/index.md": first_compacted_request,
    "docs/getting-started/install.md": install,
    "docs/getting-started/demo.md": demo,
    "docs/getting-started/first-request.md": first_request,
    "docs/user-guide/requests.md": requests_page,
    "docs/user-guide/doors/index.md": chat_door,
    "docs/user-guide/configuration.md": configuration,
    "docs/user-guide/events.md": events,
    "docs/user-guide/rollout.md": shadow,
    "docs/user-guide/session-page.md": session_page,
    "docs/user-guide/metrics.md": metrics,
    "docs/user-guide/agents/wrap.md": wrap,
    "docs/user-guide/replay.md": replay,
    "docs/user-guide/replay-tools.md": replay_tools,
}


def test_every_checked_page_exists() -> None:
    assert set(CHECKS) <= set(PAGES), set(CHECKS) - set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_the_page_runs_as_written(sandbox: Sandbox, page: str) -> None:
    outputs = sandbox.run_page(page)
    check = CHECKS.get(page)
    if check is not None:
        check(sandbox, "\n".join(outputs.values()))
