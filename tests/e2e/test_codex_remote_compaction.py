"""Codex CLI's remote compaction v2 through the proxy, on an upstream that is not OpenAI.

Codex told its provider runs remote compaction (``[model_providers.proxy.capabilities]
remote_compaction = "v2"``) compacts by sending its history with a ``compaction_trigger`` item
last and needs exactly one ``compaction`` output item back. The fake model
(``tests.responses_upstream``) is not OpenAI: it answers such a request like any other, and
refuses a ``compaction`` item in ``input``. Through the proxy (``compact.answer`` is ``proxy``
for any upstream but api.openai.com) the proxy answers the trigger itself and puts its item
back as its summary view in every later request, and the run completes; direct, or with
``compact.answer: relay``, Codex stops with "remote compaction v2 expected exactly one
compaction output item, got 0".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.e2e.clients.responses import leaks
from tests.e2e.clients.responses.codex_cli import codex_binary, codex_errors, codex_run, codex_steps
from tests.e2e.clients.responses.runs import (
    PROXY_CONFIG,
    assert_clean,
    quiet_clients,
    started_upstreams,
    task,
)
from tests.needs import agent_cli_unavailable
from tests.responses_upstream import DONE_PREFIX, ResponsesUpstream

pytestmark = [pytest.mark.e2e]

WINDOW = 16_000
STEPS = 12
# Codex compacts (remotely) above this many tokens: below the proxy's own trigger (0.75 x
# WINDOW), so Codex's compaction comes first and comes back every few steps.
AUTO_COMPACT = 9_000
NO_ITEM = "remote compaction v2 expected exactly one compaction output item, got 0"


@pytest.fixture(autouse=True)
def _quiet_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet_clients(monkeypatch)


@pytest.fixture
def responses_upstream() -> Iterator[Callable[..., ResponsesUpstream]]:
    yield from started_upstreams()


@pytest.fixture(scope="module")
def codex() -> Path:
    binary = codex_binary()
    if binary is None:
        agent_cli_unavailable("Codex CLI", "@openai/codex")
    return binary


def _items(body: dict[str, Any], kind: str) -> int:
    items = body.get("input")
    return (
        sum(1 for i in items if isinstance(i, dict) and i.get("type") == kind)
        if isinstance(items, list)
        else 0
    )


def _run(codex: Path, base_url: str, tmp_path: Path) -> Any:
    return codex_run(
        codex,
        base_url,
        task("codex", STEPS),
        tmp_path,
        context_window=WINDOW,
        auto_compact=AUTO_COMPACT,
        remote_compaction=True,
    )


def _rollout_compactions(rollout: str) -> int:
    """Codex's compactions whose new history holds a ``compaction`` item (its session record:
    a ``compacted`` line with the ``replacement_history`` it went on with)."""
    found = 0
    for line in rollout.splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        payload = record.get("payload") if isinstance(record, dict) else None
        if record.get("type") == "compacted" and isinstance(payload, dict):
            history = payload.get("replacement_history") or []
            found += any(isinstance(i, dict) and i.get("type") == "compaction" for i in history)
    return found


def test_codex_remote_compaction_v2_through_the_proxy(
    codex: Path, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any, tmp_path: Path
) -> None:
    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1)
    proxy = start_proxy(
        {**PROXY_CONFIG, "context_windows": {"default": WINDOW}, "upstream": {"base_url": fake.base_url}}
    )
    run = _run(codex, proxy.base_url, tmp_path)
    trace = f"{fake.summary()}\nexit {run.returncode} in {run.seconds:.1f} s\n{run.stderr[-2500:]}"
    print(trace)
    assert run.returncode == 0, trace
    assert run.last_message.strip().startswith(DONE_PREFIX), trace
    assert codex_steps(run.rollout) == list(range(1, STEPS + 1)), trace
    assert fake.conversation().finished, trace
    # The proxy answered every trigger: none reached the upstream, nor any compaction item.
    assert not any(_items(s.body, "compaction_trigger") for s in fake.requests), trace
    assert not [s for s in fake.requests if s.kind == "unknown_item"], trace
    installed = _rollout_compactions(run.rollout)
    assert installed >= 1, f"Codex never compacted remotely\n{trace}"
    # After a compaction Codex sends its item on every request: the upstream got the summary
    # view in its place (the ledger the proxy's summary carries).
    after = [s for s in fake.requests if "State ledger" in orjson.dumps(s.body.get("input")).decode()]
    assert after, trace
    assert_clean(fake, WINDOW, trace)
    assert leaks(run.rollout) == [], trace
    largest = max(s.tokens for s in fake.requests)
    print(
        f"\nremote compaction v2 through the proxy: {STEPS} steps, {len(fake.requests)} requests upstream, "
        f"largest {largest} of {WINDOW} tokens, {installed} compaction items installed by Codex, "
        f"{len(after)} requests with an item put back, {run.seconds:.1f} s"
    )


def test_codex_remote_compaction_v2_direct_fails_without_the_item(
    codex: Path, responses_upstream: Callable[..., ResponsesUpstream], tmp_path: Path
) -> None:
    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1)
    run = _run(codex, fake.base_url, tmp_path)
    trace = f"{fake.summary()}\nexit {run.returncode}\n{run.stderr[-2500:]}"
    assert run.returncode != 0, trace
    assert any(NO_ITEM in line for line in codex_errors(run)), trace
    assert any(_items(s.body, "compaction_trigger") for s in fake.requests), trace
    assert not fake.conversation().finished, trace


def test_codex_remote_compaction_v2_relayed_fails_without_the_item(
    codex: Path, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any, tmp_path: Path
) -> None:
    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1)
    proxy = start_proxy(
        {
            **PROXY_CONFIG,
            "context_windows": {"default": WINDOW},
            "upstream": {"base_url": fake.base_url},
            "compact": {"answer": "relay"},
        }
    )
    run = _run(codex, proxy.base_url, tmp_path)
    trace = f"{fake.summary()}\nexit {run.returncode}\n{run.stderr[-2500:]}"
    assert run.returncode != 0, trace
    assert any(NO_ITEM in line for line in codex_errors(run)), trace
    assert any(_items(s.body, "compaction_trigger") for s in fake.requests), trace
