"""Real Responses API clients through the real proxy (``POST /v1/responses``) on long tool runs.

Two clients drive their own agent loop through ``compaction-proxy serve`` with policy
``improved``: the ``openai`` SDK (``client.responses.create``, a loop driven here the way Codex
drives it with ``store: false``) and the OpenAI Agents SDK's default model
(``OpenAIResponsesModel``); Codex CLI itself is in ``test_codex_cli.py``, failed read rounds in
``test_responses_client_failures.py``, the drivers in ``tests/e2e/clients/responses/``. The model
is ``tests.responses_upstream.ResponsesUpstream``: a scripted reasoning model that asks for large
tool outputs (about 2k tokens each), reads saved outputs back with ``read_tool_output`` whenever
the proxy offers it, enforces the window like OpenAI (HTTP 400 ``context_length_exceeded``),
checks the protocol of every input (call/output pairs, reasoning items followed by their turn)
and that every reasoning item comes back with its ``encrypted_content`` byte for byte.

A run must: never send the model a request over its window (read rounds included); never break
the protocol; never alter ``encrypted_content``; complete with the final answer after every step;
never show the client a ``read_tool_output`` call or result. Direct (no proxy), the same runs fail
with the context error: that is what the proxy is for.

The ``openai`` SDK runs three ways: ``responses.create`` (JSON), ``responses.create(stream=True)``
(its raw events checked for a well-formed stream: one response id, sequence numbers, output
indexes, the completed output equal to the items streamed) and the SDK's own
``responses.stream()`` helper (which refuses an inconsistent stream). Read answers may also
stream text first, or call the client's tool beside the read (a mixed answer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.clients.responses import ClientRun, leaks
from tests.e2e.clients.responses.runs import (
    CLIENTS,
    LONG_PREAMBLE,
    PREAMBLE,
    PROXY_CONFIG,
    RUNS,
    STEPS,
    WINDOW,
    Client,
    assert_clean,
    quiet_clients,
    started_upstreams,
    task,
)
from tests.responses_upstream import DONE_PREFIX, ResponsesUpstream

pytestmark = [pytest.mark.e2e]


@pytest.fixture(autouse=True)
def _quiet_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet_clients(monkeypatch)


@pytest.fixture
def responses_upstream() -> Iterator[Callable[..., ResponsesUpstream]]:
    yield from started_upstreams()


@pytest.mark.parametrize("client", CLIENTS)
def test_long_run_stays_in_the_window(
    client: Client, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any
) -> None:
    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1)
    proxy = start_proxy({**PROXY_CONFIG, "upstream": {"base_url": fake.base_url}})
    run: ClientRun | None = None
    error: Exception | None = None
    try:
        run = client.run(proxy.base_url, task(client.name))
    except Exception as exc:  # judged after the model's own records
        error = exc
    trace = fake.summary()
    print(trace)
    assert_clean(fake, WINDOW, trace)
    assert error is None, f"the client failed: {error!r}\n{trace}"
    assert run is not None
    print(run.notes)
    assert run.final.startswith(DONE_PREFIX), f"final answer {run.final!r}\n{trace}"
    assert run.tool_steps == list(range(1, STEPS + 1))
    conversation = fake.conversation()
    assert conversation.finished and conversation.step == STEPS
    assert run.stream_problems == [], "\n".join(run.stream_problems)
    # Saved outputs were read back, and every read was answered.
    assert fake.reads, f"the proxy never offered read_tool_output with a handle\n{trace}"
    unanswered = len(fake.reads) - len(fake.follow_ups)
    assert unanswered == 0, f"{unanswered} of {len(fake.reads)} read calls got no result\n{trace}"
    # Reasoning items came back (checked byte for byte), the proxy compacted, the client saw none of it.
    assert fake.reasoning_echoed >= STEPS // 2, f"only {fake.reasoning_echoed} reasoning items came back"
    assert max(s.tokens for s in fake.requests) <= WINDOW
    assert leaks(run.history_text()) == []
    print(
        f"\nclient-run {client.name}: {STEPS} steps, {len(fake.requests)} requests, largest "
        f"{fake.max_tokens_seen} of {WINDOW} tokens, {len(fake.reads)} reads"
    )


@pytest.mark.parametrize("preamble", ["short", "long"])
@pytest.mark.parametrize("client", [pytest.param(c, id=n) for n, c in RUNS if c.stream])
def test_text_before_a_read_reaches_the_streaming_client_as_not_streamed(
    client: Client, preamble: str, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any
) -> None:
    """Read answers that say something first (``reasoning``, a ``message``, the read call): a
    short preamble never reaches the client (the non-streamed answer drops it too); a text
    longer than what the proxy holds is relayed as it streams, once per read. Either way the
    stream is well formed and the run goes on."""
    text = PREAMBLE if preamble == "short" else LONG_PREAMBLE
    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1, read_preamble=text)
    proxy = start_proxy({**PROXY_CONFIG, "upstream": {"base_url": fake.base_url}})
    run = client.run(proxy.base_url, task(client.name))
    trace = fake.summary()
    assert_clean(fake, WINDOW, trace)
    assert run.final.startswith(DONE_PREFIX), f"final answer {run.final!r}\n{trace}"
    assert run.tool_steps == list(range(1, STEPS + 1))
    assert run.stream_problems == [], "\n".join(run.stream_problems)
    assert fake.reads
    shown = run.history_text().count(text.strip())
    assert shown == (0 if preamble == "short" else len(fake.reads)), trace
    assert leaks(run.history_text()) == []


@pytest.mark.parametrize("order", ["after", "before"])
@pytest.mark.parametrize("client", [pytest.param(c, id=n) for n, c in RUNS if c.name.startswith("sdk")])
def test_a_mixed_answer_never_runs_the_call_planned_before_the_read(
    client: Client, order: str, responses_upstream: Callable[..., ResponsesUpstream], start_proxy: Any
) -> None:
    """Read answers that also call the client's tool (the read call first, or the client's):
    the proxy resolves the read and asks again without the client's call, so the client runs
    each step once, re-issued after the read, and never sees the dropped call."""
    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1, mixed=order)
    proxy = start_proxy({**PROXY_CONFIG, "upstream": {"base_url": fake.base_url}})
    run = client.run(proxy.base_url, task(client.name))
    trace = fake.summary()
    assert_clean(fake, WINDOW, trace)
    assert run.final.startswith(DONE_PREFIX), f"final answer {run.final!r}\n{trace}"
    assert run.tool_steps == list(range(1, STEPS + 1)), f"steps run: {run.tool_steps}\n{trace}"
    assert run.stream_problems == [], "\n".join(run.stream_problems)
    assert fake.mixed_calls, trace
    history = run.history_text()
    assert [c for c in fake.mixed_calls if c in history] == [], "a dropped call reached the client"
    assert leaks(history) == []


@pytest.mark.parametrize("client", [pytest.param(c, id=n) for n, c in RUNS if c.name == "agents"])
def test_direct_without_the_proxy_the_run_fails_with_the_context_error(
    client: Client, responses_upstream: Callable[..., ResponsesUpstream]
) -> None:
    """The acceptance criterion's other half: the same run, straight to the model, fails."""
    import openai

    fake = responses_upstream(window=WINDOW, steps=STEPS, read_every=1)
    with pytest.raises(openai.BadRequestError) as caught:
        client.run(fake.base_url, task(client.name))
    assert caught.value.status_code == 400
    assert caught.value.code == "context_length_exceeded"
    assert fake.rejected and fake.requests[-1].kind == "rejected"
    assert fake.conversation().step < STEPS
