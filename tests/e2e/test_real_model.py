"""End to end against a real model server: llama.cpp's server with SmolLM2-135M-Instruct.

Its window is 8,192 tokens (its own tokenizer), its errors are its own (``context_length_exceeded``),
and it keeps a prefix cache. The proxy counts with o200k_base, which gives about 0.75-0.95 of
this model's count on these trajectories, so the proxy is told a window of 6,000 for it: the
configured window is in the proxy's tokens, with room for another tokenizer.
"""

from __future__ import annotations

import base64
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from policies.ledger_extraction import build_ledger
from policies.stages.common import SUMMARY_HEADER
from replay.recording.cases import Case, build_case
from replay.recording.rows import iter_rows
from tests.conftest import ROOT, ProxyProcess
from tests.e2e.test_prepared_summaries import step
from tests.fake_upstream import free_port
from tests.model_server import MODEL_ALIAS, ModelServer, unavailable_reason
from tests.needs import model_unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.model]

LONG = ROOT / "tests" / "fixtures" / "long_trajectory.jsonl"
SAMPLE = ROOT / "tests" / "fixtures" / "trajectories_sample.jsonl"
PROXY_WINDOW = 6000


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelServer]:
    reason = unavailable_reason()
    if reason:
        model_unavailable(reason)
    server = ModelServer(free_port(), tmp_path_factory.mktemp("model") / "server.log").start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def model_stays_up(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that killed the model server (or saw it die) says so, with its log: the tests
    after it would otherwise fail on a refused connection with nothing to go on."""
    yield
    if "model" in request.fixturenames:
        server: ModelServer = request.getfixturevalue("model")
        if not server.alive():
            pytest.fail(server.death())


@pytest.fixture
def model_proxy(model: ModelServer, tmp_path: Path) -> Iterator[Any]:
    started: list[ProxyProcess] = []

    def start(extra: dict[str, Any] | None = None) -> ProxyProcess:
        config: dict[str, Any] = {
            "upstream": {"base_url": model.base_url, "timeout": 900},
            "context_windows": {"smollm2*": PROXY_WINDOW, "default": 128000},
            **(extra or {}),
        }
        directory = tmp_path / f"proxy{len(started)}"
        directory.mkdir()
        proxy = ProxyProcess(config, directory).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


def model_summarizer(model: ModelServer) -> dict[str, Any]:
    """The local model as the summarizer: its input kept within its window, and a short
    answer limit (a 135M model rambles; a cut-off answer falls back to the ledger)."""
    return {
        "kind": "openai",
        "base_url": model.base_url,
        "model": MODEL_ALIAS,
        "timeout": 600,
        "max_output_tokens": 400,
        "max_input_tokens": 6000,
        # What the model's summary holds at the compaction point itself: waited for here
        # (prepared ahead, the default, is tests/e2e/test_prepared_summaries.py's).
        "prepare_at": None,
    }


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="sk-local", max_retries=0, timeout=900)


def load_case(path: Path, instance: str) -> Case:
    for number, row in enumerate(iter_rows(path)):
        if row["instance_id"] == instance:
            case = build_case(row, number)
            assert isinstance(case, Case)
            return case
    raise AssertionError(instance)


def step_request(case: Case, index: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL_ALIAS, "messages": list(case.messages[:index]), "max_tokens": 1}
    if case.tools:
        body["tools"] = list(case.tools)
    return body


def test_plain_chat_through_the_proxy(model_proxy: Any) -> None:
    proxy = model_proxy({"policy": "improved"})
    raw = client(proxy.base_url).chat.completions.with_raw_response.create(
        model=MODEL_ALIAS, messages=[{"role": "user", "content": "Name one colour."}], max_tokens=12
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    assert raw.headers["x-compaction-policy"] == "improved"


def test_streaming_through_the_proxy(model_proxy: Any) -> None:
    proxy = model_proxy()
    stream = client(proxy.base_url).chat.completions.create(
        model=MODEL_ALIAS,
        messages=[{"role": "user", "content": "Count from one to five."}],
        max_tokens=24,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3 and text.strip()
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_the_servers_errors_pass_through_unchanged(model: ModelServer, model_proxy: Any) -> None:
    # Policy full: the proxy learns the window from the refusal, but the request it would send
    # again is the same one, so the server's own error is the answer.
    proxy = model_proxy({"policy": "full"})
    request = {
        "model": MODEL_ALIAS,
        "messages": [{"role": "user", "content": "word " * 9000}],
        "max_tokens": 4,
    }
    direct = httpx.post(model.base_url + "/chat/completions", json=request, timeout=60)
    through = httpx.post(proxy.base_url + "/chat/completions", json=request, timeout=60)
    assert direct.status_code == through.status_code == 400
    assert through.json() == direct.json()
    assert direct.json()["error"]["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as raised:
        client(proxy.base_url).chat.completions.create(**request)
    assert raised.value.code == "context_length_exceeded"


def test_a_trajectory_longer_than_the_window_fails_direct_and_succeeds_through_improved(
    model: ModelServer, model_proxy: Any
) -> None:
    case = load_case(LONG, "getmoto__moto-6114")
    direct = client(model.base_url)
    outcomes: list[str] = []
    steps: list[int] = []
    for index in case.steps:
        steps.append(index)
        try:
            direct.chat.completions.create(**step_request(case, index))
            outcomes.append("ok")
        except openai.BadRequestError as error:
            assert error.code == "context_length_exceeded"
            outcomes.append("context_length_exceeded")
        if outcomes.count("context_length_exceeded") == 3:
            break  # three steps past the window: the run is over without the proxy
    failed = outcomes.count("context_length_exceeded")
    assert failed == 3, outcomes
    # Once the history outgrows the window, every later request fails.
    assert outcomes[outcomes.index("context_length_exceeded") :] == ["context_length_exceeded"] * failed

    proxy = model_proxy(
        {
            "policy": "improved",
            "summarizer": model_summarizer(model),
        }
    )
    through = client(proxy.base_url)
    after: list[int] = []
    for index in steps:  # the same steps, each past the window compacted and answered
        raw = through.chat.completions.with_raw_response.create(
            **step_request(case, index), extra_headers={"X-Session-Id": "moto-6114"}
        )
        assert raw.http_response.status_code == 200
        after.append(int(raw.headers["x-compaction-tokens-after"]))
    assert max(after) <= PROXY_WINDOW
    print(f"direct: {outcomes.count('ok')} ok, {failed} context_length_exceeded; through improved: all ok")

    # The summary was written by the model, and the ledger kept what it must not lose.
    time.sleep(0.3)  # events are written in the background
    events = session_events(proxy, "moto-6114")
    summarized = [e for e in events if e.get("summary")]
    assert summarized, events
    by_model = [e for e in summarized if e["summary"]["model"] == MODEL_ALIAS]
    assert by_model, [e["summary"] for e in summarized]
    first = next(e for e in events if e.get("summary"))["parent_range"]["messages"][0]
    widest = max(by_model, key=lambda e: e["parent_range"]["messages"][1])
    assert_ledger_survives(widest, case, first_covered=first)


def session_events(proxy: ProxyProcess, session: str) -> list[dict[str, Any]]:
    response = httpx.get(
        proxy.url + "/v1/compaction/events",
        params={"session": session, "limit": 1000},
        headers={"authorization": "Bearer sk-local"},
        timeout=30,
    )
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def assert_ledger_survives(
    event: dict[str, Any], history: Case | list[dict[str, Any]], first_covered: int
) -> None:
    """The summary holds the model's own words and, in its ledger, every exact identifier of
    the history summarized so far (all cycles: each summary carries the previous one's)."""
    messages = list(history.messages) if isinstance(history, Case) else history
    view = orjson.loads(zlib.decompress(base64.b64decode(event["view"])))
    (summary,) = [m for m in view if str(m.get("content") or "").startswith(SUMMARY_HEADER)]
    text = summary["content"]
    narrative, _, ledger_text = text.partition("## State ledger")
    assert narrative.replace(SUMMARY_HEADER, "").strip(), "the model wrote no narrative"
    end = event["parent_range"]["messages"][1]
    ledger = build_ledger(messages, first_covered, end)
    identifiers = [f.path for f in ledger.files[-40:]]
    identifiers += [" ".join(c.command.split())[:60] for c in ledger.commands[-40:]]
    identifiers += [*ledger.errors[:40], *ledger.test_summaries[-40:]]
    identifiers = [i for i in identifiers if i.strip()]
    assert identifiers
    for identifier in identifiers:
        assert identifier in ledger_text, identifier
    # The goal is the task: kept verbatim in the view before the summary (the ledger says so).
    goal = ledger.goal.splitlines()[0]
    if "kept verbatim above this summary" in ledger_text:
        assert any(goal in str(m.get("content")) for m in view[: view.index(summary)]), goal
    else:
        assert goal in ledger_text, goal
    dropped = [i for i in identifiers if i not in narrative]
    # The small model's own words drop most exact identifiers; the ledger keeps them all.
    print(f"identifiers: {len(identifiers)}, missing from the model's narrative: {len(dropped)}")


def with_user_turns(case: Case) -> list[dict[str, Any]]:
    """A recorded run as a chat agent's session: after every tool exchange the user says to
    go on, so each step starts a new user turn (what sre's auto_compact is built for)."""
    messages: list[dict[str, Any]] = list(case.messages[: case.steps[0]])
    for position, index in enumerate(case.steps):
        end = case.steps[position + 1] if position + 1 < len(case.steps) else len(case.messages)
        messages += case.messages[index:end]
        messages.append({"role": "user", "content": f"Good. Go on (step {position + 2})."})
    return messages


def test_sre_summarizes_with_the_model(model: ModelServer, model_proxy: Any) -> None:
    # sre summarizes everything before the last user message, by the model, once the view
    # passes 0.8 x window.
    case = load_case(LONG, "getmoto__moto-6114")
    chat = with_user_turns(case)
    proxy = model_proxy(
        {
            "policy": "sre",
            "summarizer": model_summarizer(model),
        }
    )
    through = client(proxy.base_url)
    events: list[dict[str, Any]] = []
    turns = [i + 1 for i, m in enumerate(chat) if m["role"] == "user" and i > 1]
    for end in turns:
        body = {"model": MODEL_ALIAS, "messages": chat[:end], "tools": list(case.tools), "max_tokens": 1}
        raw = through.chat.completions.with_raw_response.create(
            **body, extra_headers={"X-Session-Id": "chat"}
        )
        assert raw.http_response.status_code == 200
        if raw.headers.get("x-compaction-trigger"):
            time.sleep(0.3)  # events are written in the background
            events = session_events(proxy, "chat")
            if any((e.get("summary") or {}).get("model") == MODEL_ALIAS for e in events):
                break
    by_model = [e for e in events if (e.get("summary") or {}).get("model") == MODEL_ALIAS]
    assert by_model, [e.get("summary") for e in events]
    assert by_model[0]["summary"]["prompt_family"] == "sre"
    first = next(e for e in events if e.get("summary"))["parent_range"]["messages"][0]
    assert_ledger_survives(by_model[-1], chat, first_covered=first)


def test_a_compaction_point_never_waits_for_the_model_summarizer(
    model: ModelServer, start_proxy: Any, upstream: Any
) -> None:
    """SmolLM2 as the summarizer with summaries prepared ahead: no step waits for it (a point
    that waited would take its whole answer, seconds on two cores), and once the agent's step
    outlasts the summary, the model's summary stands in the next point's view."""
    summarizer = {**model_summarizer(model), "prepare_at": 0.5}
    proxy = start_proxy(
        {"policy": "improved", "context_windows": {"default": 8000}, "summarizer": summarizer}
    )
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Run every check and report."},
    ]
    metrics_url = proxy.url + "/metrics"
    points, slowest = 0, 0.0
    for i in range(40):
        messages += step(i)
        started = time.perf_counter()
        answer = httpx.post(
            proxy.base_url + "/chat/completions",
            json={"model": "gpt-4o", "messages": messages},
            headers={"authorization": "Bearer sk-local", "x-session-id": "model-prepared"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text[:300]
        slowest = max(slowest, time.perf_counter() - started)
        if answer.headers.get("x-compaction-trigger"):
            points += 1
            if points == 2:
                break
        # A slow agent step: the summary prepared past the mark lands before the next point.
        deadline = time.monotonic() + 300
        while 'prepared_summaries_total{result="prepared"}' not in httpx.get(metrics_url).text:
            if time.monotonic() > deadline or i < 3:
                break
            time.sleep(0.5)
    assert points == 2 and slowest < 2.0, (points, slowest)
    events = httpx.get(
        proxy.base_url + "/compaction/events",
        params={"session": "model-prepared"},
        headers={"authorization": "Bearer sk-local"},
    ).json()["data"]
    made = [e["summary"] for e in events if e["trigger"] and e["summary"]]
    assert any(s["prepared"] == "used" and s["model"] == MODEL_ALIAS for s in made), made
