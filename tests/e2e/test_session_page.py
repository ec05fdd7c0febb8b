"""The session page (``GET /ui``) in a real browser: Debian's Chromium, headless, driven by
Playwright, every request to another host refused. A compacting agent run through the chat
door (the openai SDK, an 8k window, a model that reads saved outputs back) and one compacted
request through each of the other doors; the page lists the sessions, draws one request per
event of the run, shows its compaction points with the view against what the client sent,
updates without a reload, and shows nothing to another tenant's key. A screenshot is written
to ``tests/artifacts/session_page.png``."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ROOT
from tests.e2e import test_anthropic_door as anthropic_door
from tests.e2e import test_responses_door as responses_door
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion
from tests.needs import need_chromium

pytestmark = pytest.mark.e2e

KEY = "sk-session-page-tenant-a-000000"
OTHER_KEY = "sk-session-page-tenant-b-000000"
CONFIG: dict[str, Any] = {
    "policy": "improved",
    "context_windows": {"default": 8000},
    "models": {"gpt-4o*": {"input_price": 2.5}},
}
STEPS = 12
HANDLE = re.compile(r"handle=(out_[0-9a-f]{16})")
ARTIFACTS = ROOT / "tests" / "artifacts"


def tool_output(step: int) -> str:
    return "\n".join(f"step {step} line {n}: checked module_{step}.py, nothing to report" for n in range(120))


class ScriptedAgentModel:
    """The model of the chat run: one ``execute_bash`` call per step, and once the proxy offers
    ``read_tool_output`` with a handle in view, a read before every other step."""

    def __init__(self) -> None:
        self.step = 0
        self.read_at: set[int] = set()

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        offered = any(t.get("function", {}).get("name") == "read_tool_output" for t in body.get("tools", []))
        handles = HANDLE.findall(json.dumps(body["messages"]))
        read_round = body["messages"][-1].get("role") == "tool" and body["messages"][-1].get(
            "tool_call_id", ""
        ).startswith("read_")
        if offered and handles and not read_round and self.step % 2 == 0 and self.step not in self.read_at:
            self.read_at.add(self.step)
            call = {"handle": handles[0], "pattern": "line 7:"}
            return Reply(body=completion(tool_calls=[_call(f"read_{self.step}", "read_tool_output", call)]))
        self.step += 1
        if self.step > STEPS:
            return Reply(body=completion("All checks are done."))
        arguments = {"command": f"./check.sh {self.step}"}
        return Reply(body=completion(tool_calls=[_call(f"call_{self.step}", "execute_bash", arguments)]))


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


BASH = {
    "type": "function",
    "function": {
        "name": "execute_bash",
        "description": "Run a bash command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def run_chat_agent(proxy: Any, upstream: FakeUpstream) -> int:
    """The agent loop through the openai SDK; returns the number of requests it sent."""
    model = ScriptedAgentModel()
    upstream.queue(*[Reply(dynamic=model) for _ in range(3 * STEPS)])
    client = openai.OpenAI(
        base_url=proxy.base_url, api_key=KEY, max_retries=0, default_headers={"x-session-id": "page-run"}
    )
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Run every check and report."},
    ]
    for sent in range(1, 3 * STEPS):
        answer = client.chat.completions.create(model="gpt-4o", messages=messages, tools=[BASH])  # type: ignore[list-item]
        message = answer.choices[0].message
        if not message.tool_calls:
            upstream.replies.clear()  # the script's answers it did not need
            return sent
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            step = int(json.loads(call.function.arguments)["command"].split()[-1])  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": tool_output(step)})
    raise AssertionError("the run did not finish")


def other_doors(proxy: Any, upstream: FakeUpstream) -> None:
    """One compacted request with a read through the Responses and the Messages doors."""
    upstream.queue(
        Reply(dynamic=responses_door.reads_first_handle),
        Reply(body=responses_door.response([responses_door.message("value is 4242")])),
    )
    openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0).responses.create(
        model="gpt-5",
        input=responses_door.history(),  # type: ignore[arg-type]
        store=False,
        extra_headers={"x-session-id": "page-responses"},
    )
    upstream.queue(
        Reply(dynamic=anthropic_door.reads_first_handle),
        Reply(body=anthropic_door.message([{"type": "text", "text": "value is 4242"}])),
    )
    httpx.post(
        proxy.base_url + "/messages",
        json={
            "model": "claude-sonnet-4-6",
            "max_tokens": 1024,
            "messages": anthropic_door.history(),
            "tools": anthropic_door.TOOLS,
        },
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "x-session-id": "page-messages"},
        timeout=30,
    ).raise_for_status()


def session_events(proxy: Any, session: str) -> list[dict[str, Any]]:
    return httpx.get(
        proxy.base_url + "/compaction/events",
        params={"session": session, "limit": 1000},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=10,
    ).json()["data"]


@pytest.fixture
def browser() -> Any:
    chromium = need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


def test_the_session_page_shows_a_compacting_run(
    start_proxy: Any, upstream: FakeUpstream, browser: Any
) -> None:
    proxy = start_proxy(CONFIG)
    sent = run_chat_agent(proxy, upstream)
    other_doors(proxy, upstream)
    events = session_events(proxy, "page-run")
    points = [e for e in events if e["trigger"]]
    assert len(points) >= 2 and sent > STEPS
    assert {e["client_session"] for e in events} == {"page-run"}
    listed_rows = httpx.get(
        proxy.base_url + "/compaction/sessions", headers={"authorization": f"Bearer {KEY}"}
    ).json()["data"]
    assert sorted(r["client_session"] for r in listed_rows) == ["page-messages", "page-responses", "page-run"]
    origin = proxy.base_url.removesuffix("/v1")
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    off_host: list[str] = []

    def only_the_proxy(route: Any) -> None:
        if route.request.url.startswith(origin + "/"):
            route.continue_()
        else:
            off_host.append(route.request.url)
            route.abort()

    page.route("**/*", only_the_proxy)
    started = time.perf_counter()
    page.goto(origin + "/ui")
    loaded = time.perf_counter()
    page.fill("#key", KEY)
    page.click("button[type=submit]")
    rows = page.locator("#sessions tbody tr[data-session]")
    rows.first.wait_for()
    listed = time.perf_counter()
    assert rows.count() == 3
    doors = sorted(page.locator("#sessions tbody tr[data-session] td:nth-child(4)").all_inner_texts())
    assert doors == ["anthropic", "chat", "responses"]
    # Each row is named by the client's own X-Session-Id, the proxy's s_ id under it.
    named = sorted(page.locator("#sessions tbody tr[data-session] td.session button").all_inner_texts())
    assert named == ["page-messages", "page-responses", "page-run"]
    assert all(t.startswith("s_") for t in page.locator("#sessions td.session .secondary").all_inner_texts())
    run_saved = sum(e["tokens_before"] - e["tokens_after"] for e in events)
    assert f"${run_saved * 2.5 / 1e6:.4f}" in page.locator("#sessions tbody").inner_text()
    run_row = page.locator("#sessions tbody tr[data-session]", has_text="chat")
    # Keyboard alone opens a session.
    run_row.locator("button").focus()
    page.keyboard.press("Enter")
    page.locator("article.point").first.wait_for()
    assert page.locator("#detail-title").inner_text() == "Session page-run"
    facts = page.locator("#detail-facts").inner_text()
    assert "your session id\npage-run" in facts and f"proxy session\n{events[0]['session']}" in facts
    print(
        f"\nsession page: loaded in {(loaded - started) * 1000:.0f} ms, sessions listed "
        f"{(listed - loaded) * 1000:.0f} ms after the key, a session of {len(events)} events drawn "
        f"{(time.perf_counter() - listed) * 1000:.0f} ms after the click"
    )
    # One point per event on each line, a mark per compaction point and per request with reads.
    assert page.locator("#chart circle.pt-sent").count() == len(events)
    assert page.locator("#chart circle.pt-upstream").count() == len(events)
    assert page.locator("#chart line.cp-mark").count() == len(points)
    with_reads = [e for e in events if (e["read_tool_output"] or {}).get("rounds")]
    assert with_reads and page.locator("#chart polygon.read-mark").count() == len(with_reads)
    assert page.locator("#chart line.mark-window").count() == 1
    assert page.locator("article.point").count() == len(points)
    # The view against what the client sent: messages that left it, inserted, replaced.
    page.locator("article.point ol.diff").first.wait_for()
    diff = page.locator("article.point").last.locator("ol.diff")
    assert diff.locator("li.removed").count() >= 1 and diff.locator("li.inserted").count() >= 1
    assert "[Summary" in page.locator("article.point").last.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("h1").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "session_page.png"), full_page=False)
    # Live: a new request of the session shows up without a reload.
    upstream.queue(Reply(body=completion("still done")))
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Run every check and report."},
    ]
    for step in range(1, STEPS + 1):
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [_call(f"call_{step}", "execute_bash", {"command": f"./check.sh {step}"})],
            },
            {"role": "tool", "tool_call_id": f"call_{step}", "content": tool_output(step)},
        ]
    httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": f"Bearer {KEY}", "x-session-id": "page-run"},
        timeout=30,
    ).raise_for_status()
    page.locator("#chart circle.pt-sent").nth(len(events)).wait_for(state="attached", timeout=10_000)
    # A session id is whatever a client sends: shown as text, bounded.
    hostile = "<img src=x onerror=window.__xss=1>" + "x" * 300
    upstream.queue(Reply(body=completion("done")))
    httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        headers={"authorization": f"Bearer {KEY}", "x-session-id": hostile},
        timeout=30,
    ).raise_for_status()
    page.evaluate("loadSessions()")  # the list again (it also refreshes every 5 s)
    hostile_row = page.locator("#sessions tbody tr[data-session]", has_text="<img src=x")
    hostile_row.wait_for()
    assert hostile_row.locator("td.session button").inner_text() == hostile[:127] + "\u2026"
    assert page.locator("#sessions img").count() == 0 and page.evaluate("window.__xss") is None
    assert off_host == []
    # Another tenant's key sees none of it.
    page.click("#forget")
    page.fill("#key", OTHER_KEY)
    page.click("button[type=submit]")
    page.locator("#sessions tbody td.empty").wait_for()
    assert page.locator("#sessions tbody tr[data-session]").count() == 0
    assert (
        httpx.get(
            proxy.base_url + "/compaction/sessions", headers={"authorization": f"Bearer {OTHER_KEY}"}
        ).json()["data"]
        == []
    )
    page.close()


def test_the_page_is_self_contained(start_proxy: Any) -> None:
    proxy = start_proxy(CONFIG)
    response = httpx.get(proxy.base_url.removesuffix("/v1") + "/ui")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in response.headers["content-security-policy"]
    assert not re.search(r"(src|href)=\"(https?:)?//", response.text)
