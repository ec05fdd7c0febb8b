"""Real Responses API clients through the real proxy when the model's answer after a read fails.

The proxy answers a ``read_tool_output`` call itself and asks the model again (a *read
follow-up round*). When that round fails (HTTP 500 or 429, a connection reset, or a failure after
the read answer already streamed text), the client must get an error, not a completed response,
and the run must stop there. The clients and the scripted model are those of
``test_responses_clients.py``; the model's window is not enforced here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.clients.responses import ClientRun, StreamFailed
from tests.e2e.clients.responses.runs import (
    PROXY_CONFIG,
    RUNS,
    STEPS,
    UNLIMITED,
    failure_cases,
    quiet_clients,
    started_upstreams,
    task,
)
from tests.responses_upstream import Failure, ResponsesUpstream

pytestmark = [pytest.mark.e2e]


@pytest.fixture(autouse=True)
def _quiet_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet_clients(monkeypatch)


@pytest.fixture
def responses_upstream() -> Iterator[Callable[..., ResponsesUpstream]]:
    yield from started_upstreams()


@pytest.mark.parametrize(
    "name, failure, preamble", list(failure_cases([(name, client.stream) for name, client in RUNS]))
)
def test_a_failed_read_round_reaches_the_client_as_an_error(
    name: str,
    failure: Failure,
    preamble: str | None,
    responses_upstream: Callable[..., ResponsesUpstream],
    start_proxy: Any,
) -> None:
    import openai

    client = dict(RUNS)[name]
    fake = responses_upstream(
        window=UNLIMITED,
        steps=STEPS,
        read_every=1,
        fail_read_follow_up=1,
        failure=failure,
        read_preamble=preamble,
    )
    proxy = start_proxy({**PROXY_CONFIG, "upstream": {"base_url": fake.base_url}})
    run: ClientRun | None = None
    error: Exception | None = None
    try:
        run = client.run(proxy.base_url, task(client.name))
    except Exception as exc:
        error = exc
    trace = fake.summary()
    print(f"client error: {error!r}\n{trace}")
    assert fake.failures_injected == 1, f"no read follow-up round was failed\n{trace}"
    assert fake.problems == [], "\n".join(fake.problems)
    assert error is not None, (
        f"the client completed as if nothing failed: final answer {run.final if run else None!r} "
        f"after {len(run.tool_steps) if run else 0} steps\n{trace}"
    )
    assert "timeout" not in type(error).__name__.lower(), f"the client hung instead: {error!r}"
    if preamble is None:
        # Nothing reached the client yet (a round that only reads sends nothing): the upstream's
        # own status, streamed or not (a reset before the answer is the proxy's 502).
        expected = failure.status if failure.kind == "status" else 502
        assert isinstance(error, openai.APIStatusError), f"{error!r}"
        assert error.status_code == expected, f"{error!r}"
    elif client.name.startswith("sdk"):
        # Text already streamed: the stream ends with an error event, never response.completed.
        assert isinstance(error, StreamFailed) and error.event is not None, f"{error!r}"
    else:
        # The Agents SDK raises on the stream's error event (ModelBehaviorError in 0.24).
        assert "terminal event `error`" in str(error), f"{error!r}"
    # The run stopped there: nothing was asked after the failed round.
    assert not fake.conversation().finished
    assert fake.requests[-1].kind == "failed", trace
