"""The compaction's own cost through the running proxy: a canary run whose treated session
compacts with a model summarizer that prepares ahead (a fake one that bills 1,000 input and
100 output tokens a call), beside a holdout session. Every token the summarizer billed is in
the session's events (``compaction_cost``, apart from the prompt), in ``/metrics`` by source
and arm, in the sessions list (priced at the summarizer's prices, the savings net of it), on
``/ui`` per session and per arm, and in ``canary status`` (the arm's cost holds it, and what is
saved per session is net of it)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.e2e.test_canary import canary_cli, status, wait_for
from tests.e2e.test_prepared_summaries import step
from tests.e2e.test_session_page import browser  # noqa: F401 (the fixture)
from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion

pytestmark = pytest.mark.e2e

KEY = "sk-own-cost-tenant-000000000"
BILLED = (1_000, 100)  # what each summarizer call bills
SMALL_PRICES = (0.15, 0.6)  # the summarizer model's, per million tokens


@pytest.fixture
def summarizer_server() -> Any:
    server = FakeUpstream().start()
    yield server
    server.stop()


def billed_summary(_: Recorded) -> Reply:
    body = completion(
        "The agent runs the scripted checks one by one; each printed its log.", model="small-model"
    )
    body["usage"] = {"prompt_tokens": BILLED[0], "completion_tokens": BILLED[1], "total_tokens": sum(BILLED)}
    return Reply(body=body)


def config(summarizer: FakeUpstream) -> dict[str, Any]:
    return {
        "policy": "improved",
        "mode": "canary",
        "context_windows": {"default": 8_000},
        "canary": {"share": 0.5, "evaluate_every_seconds": 60},
        "models": {
            "gpt-4o*": {"input_price": 2.5, "output_price": 10.0},
            "small-model": {"input_price": SMALL_PRICES[0], "output_price": SMALL_PRICES[1]},
        },
        "summarizer": {
            "kind": "openai",
            "model": "small-model",
            "base_url": summarizer.base_url,
            "prepare_at": 0.5,
        },
    }


def ask(proxy: Any, session: str, messages: list[Any]) -> httpx.Response:
    answer = httpx.post(
        proxy.base_url + "/chat/completions",
        json={"model": "gpt-4o", "messages": messages},
        # The replay's header: each point settles the preparation in flight (the same decisions
        # every run), so which point uses which preparation does not depend on timing.
        headers={"authorization": f"Bearer {KEY}", "x-session-id": session, "x-compaction-prepared": "wait"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text[:300]
    return answer


def one_in_each_arm(proxy: Any) -> tuple[str, str]:
    """A session id the canary places in the treated arm and one in the holdout (their first
    requests say)."""
    found: dict[str, str] = {}
    for n in range(64):
        session = f"own-cost-{n}"
        first = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": session},
        ]
        found.setdefault(ask(proxy, session, first).headers["x-compaction-arm"], session)
        if len(found) == 2:
            return found["treated"], found["holdout"]
    raise AssertionError(f"the sessions all went to one arm: {found}")


def events_of(proxy: Any, session: str) -> list[dict[str, Any]]:
    return httpx.get(
        proxy.base_url + "/compaction/events",
        params={"session": session, "limit": 1000},
        headers={"authorization": f"Bearer {KEY}"},
    ).json()["data"]


def own_tokens(events: list[dict[str, Any]], source: str | None = None) -> tuple[int, int]:
    records = [(e.get("compaction_cost") or {}) for e in events]
    if source is not None:
        records = [r.get(source) or {} for r in records]
    return sum(r.get("input_tokens", 0) for r in records), sum(r.get("output_tokens", 0) for r in records)


def metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.split()[-1])
    return 0.0


def test_the_compaction_own_cost_is_apart_from_the_prompt_everywhere(
    start_proxy: Any,
    upstream: FakeUpstream,
    summarizer_server: FakeUpstream,
    browser: Any,  # noqa: F811 (the fixture)
) -> None:
    summarizer_server.queue(*(Reply(dynamic=billed_summary) for _ in range(40)))
    proxy = start_proxy(config(summarizer_server))
    treated, holdout = one_in_each_arm(proxy)
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Run every check and report."},
    ]
    points = 0
    for i in range(22):
        messages += step(i)
        points += bool(ask(proxy, treated, messages).headers.get("x-compaction-trigger"))
        ask(proxy, holdout, [*messages[:2], {"role": "assistant", "content": f"step {i}"}])
    assert points >= 2
    root = proxy.base_url.removesuffix("/v1")

    def spent() -> float:
        return metric(
            httpx.get(root + "/metrics").text, "compaction_proxy_prepared_summary_tokens_total", kind="input"
        )

    def settled() -> bool:
        """Every call the summarizer answered is paid for, and none came since (a dry run past
        the mark may call it a moment after the last answer)."""
        calls = len(summarizer_server.requests)
        if spent() != calls * BILLED[0]:
            return False
        time.sleep(0.5)
        return len(summarizer_server.requests) == calls

    wait_for(settled)
    calls = len(summarizer_server.requests)
    assert calls >= 2
    # One more request of the session, too small to prepare anything: it carries the
    # preparations that finished since its last event.
    ask(proxy, treated, messages[:2])
    total = (calls * BILLED[0], calls * BILLED[1])
    wait_for(lambda: own_tokens(events_of(proxy, treated)) == total)
    events = events_of(proxy, treated)
    # Prepared ahead, so no point paid for a summary itself: every token is a preparation's.
    assert own_tokens(events, "preparation") == total and own_tokens(events, "point") == (0, 0)
    used = [e for e in events if (e.get("summary") or {}).get("prepared") == "used"]
    assert used and all(e["arm"] == "treated" for e in events)
    assert own_tokens(events_of(proxy, holdout)) == (0, 0)

    # /metrics: by kind, source and arm.
    text = httpx.get(root + "/metrics").text
    name = "compaction_proxy_compaction_tokens_total"
    assert metric(text, name, kind="input", source="preparation", arm="treated") == total[0]
    assert metric(text, name, kind="output", source="preparation", arm="treated") == total[1]
    assert metric(text, name, kind="input", source="point", arm="treated") == 0

    # The sessions list: the own tokens summed, priced at the summarizer's prices, savings net.
    rows = httpx.get(
        proxy.base_url + "/compaction/sessions", headers={"authorization": f"Bearer {KEY}"}
    ).json()["data"]
    row = next(r for r in rows if r["client_session"] == treated)
    assert (row["compaction_input_tokens"], row["compaction_output_tokens"], row["arm"]) == (
        *total,
        "treated",
    )
    own_usd = (total[0] * SMALL_PRICES[0] + total[1] * SMALL_PRICES[1]) / 1e6
    assert row["compaction_cost_usd"] == round(own_usd, 6)
    assert row["savings_usd"] == round(row["prompt_savings_usd"] - own_usd, 6)

    # /ui: per session and per arm, the own cost beside the prompt's savings, and the net.
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(root + "/ui")
    page.fill("#key", KEY)
    page.click("button[type=submit]")
    page.locator("#sessions tbody tr[data-session]").first.wait_for()
    listed = page.locator("#sessions tbody tr[data-session]", has_text=treated).inner_text()
    own_cell = f"{total[0]:,} / {total[1]:,}"
    assert own_cell in listed and f"${row['savings_usd']:.4f}" in listed and f"${own_usd:.4f}" in listed
    arm_row = page.locator('#arms tr[data-arm="treated"]').inner_text()
    assert own_cell in arm_row and f"${own_usd:.4f}" in arm_row
    page.close()

    # canary status: the arm's cost holds the own cost; saved per session is net of it.
    wait_for(lambda: status(proxy)[1]["arms"]["treated"]["compaction_input_tokens"] == total[0])
    _, report = status(proxy)
    arm = report["arms"]["treated"]
    assert arm["compaction_cost_per_session"] == pytest.approx(own_usd / arm["sessions"])
    assert arm["cost_per_session"] == pytest.approx(
        arm["prompt_cost_per_session"] + arm["compaction_cost_per_session"]
    )
    assert report["saved_per_session"] == pytest.approx(
        report["arms"]["holdout"]["cost_per_session"] - arm["cost_per_session"]
    )
    table = canary_cli(proxy, "status").stdout
    assert "compaction's own per session" in table and "saved per session (net)" in table
