"""The proxy's compaction items (``proxy/dialects/responses_compaction.py``): made and verified
with the tenant, found and put back in an ``input``, what an item stands for, the answers."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest

from proxy.config.sections import CompactSettings
from proxy.dialects import responses_compaction as rc
from proxy.dialects.responses import ResponsesCompactDialect, ResponsesDialect
from proxy.wire.errors import ProxyError
from proxy.wire.sse_framer import event_data

SECRET = b"k" * 32
TENANT = "t_0123456789abcdef01234567"


def _item(tenant: str = TENANT, secret: bytes = SECRET) -> dict[str, object]:
    record = rc.new_record()
    return rc.item(record, rc.seal(record, tenant, secret))


def test_an_item_verifies_for_its_tenant_and_names_its_record() -> None:
    record = rc.new_record()
    item = rc.item(record, rc.seal(record, TENANT, SECRET))
    assert item["type"] == "compaction" and rc.is_ours(item)
    assert record not in item["id"] or item["id"] != record  # the item's id is not the record's key
    assert rc.record_of(item, TENANT, SECRET) == record


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda c: c.replace("cpx1.cmp_", "cpx1.cmp_0", 1)[:-1], "was not made"),  # the record altered
        (lambda c: c[:-4] + ("AAAA" if not c.endswith("AAAA") else "BBBB"), "does not verify"),
        (lambda c: c.rsplit(".", 1)[0], "does not verify"),  # no mac
        (lambda c: "gAAAAB" + c, "was not made"),  # OpenAI's own encrypted content
    ],
)
def test_an_altered_item_is_refused_with_why(change: object, why: str) -> None:
    item = _item()
    forged = {**item, "encrypted_content": change(item["encrypted_content"])}  # type: ignore[operator]
    with pytest.raises(ProxyError) as refused:
        rc.record_of(forged, TENANT, SECRET)
    assert refused.value.status == 400 and refused.value.code == "invalid_compaction_item"
    assert why in refused.value.message and refused.value.param == "input"


def test_another_tenants_or_deployments_item_does_not_verify() -> None:
    item = _item()
    for tenant, secret in (("t_another", SECRET), (TENANT, b"x" * 32)):
        with pytest.raises(ProxyError, match="does not verify for this API key"):
            rc.record_of(item, tenant, secret)


def test_the_trigger_is_found_and_removed() -> None:
    items = [{"type": "message", "role": "user", "content": "hi"}, {"type": "compaction_trigger"}]
    assert rc.has_trigger(items) and not rc.has_trigger(items[:1]) and not rc.has_trigger("text")
    assert rc.without_trigger(items) == items[:1]
    assert ResponsesDialect.remote_compaction is not None
    assert ResponsesDialect.remote_compaction.wanted({"input": items})
    assert not ResponsesDialect.remote_compaction.wanted({"input": items[:1]})
    endpoint = ResponsesCompactDialect.remote_compaction
    assert endpoint is not None and endpoint.wanted({"input": items[:1]})


def test_items_are_put_back_in_place() -> None:
    items = ["a", {"type": "compaction"}, "b", {"type": "compaction"}]
    assert rc.put_back(items, {1: ["x", "y"], 3: []}) == ["a", "x", "y", "b"]
    assert rc.items_of(rc.record_content(["x", {"y": 1}])) == ["x", {"y": 1}]
    with pytest.raises(ValueError):
        rc.items_of('{"not": "a list"}')


def test_an_item_stands_for_all_but_what_the_client_keeps() -> None:
    dialect = ResponsesDialect()
    earlier = {"type": "message", "role": "user", "content": "[Summary] an earlier record's"}
    raw = [
        {"type": "message", "role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": "task"},
        earlier,
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    parsed = dialect.parse({"model": "gpt-5", "input": raw})
    messages = parsed.neutral["messages"]
    summary = {"role": "user", "content": "[Summary of the earlier conversation]"}
    view = [messages[0], messages[1], summary, *messages[3:]]
    outcome = SimpleNamespace(messages=view, origin=[0, 1, -1, 3, 4])
    kept = rc.stands_for(messages, parsed.private, raw, outcome, ours=set())
    assert [at for _, at in kept] == [-1, 3, 4]  # the summary and the tail; not the client's own
    # No view (the policy left the request as it came): everything but the client's messages;
    # a user message an earlier item put back is the proxy's, kept in the new record.
    untouched = SimpleNamespace(messages=None, origin=None)
    whole = rc.stands_for(messages, parsed.private, raw, untouched, {id(earlier)})
    assert [at for _, at in whole] == [2, 3, 4]
    rendered = dialect.render(parsed, [m for m, _ in kept], [at for _, at in kept])["input"]
    assert rendered[1:] == raw[3:] and rendered[0]["content"][0]["text"].startswith("[Summary")


def test_the_three_answers_hold_exactly_one_compaction_item() -> None:
    body = {"model": "m", "input": [], "instructions": "be brief", "stream": True}
    item = _item()
    answer = rc.Answer(body=body, item=item, usage=rc.usage(900, 120))
    response = answer.response()
    assert response["output"] == [item] and response["status"] == "completed"
    assert response["usage"] == {
        "input_tokens": 900,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 120,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 1020,
    }
    events = [orjson.loads(event_data(e)) for e in answer.events().split(b"\n\n") if e]
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(5))
    assert [e["item"] for e in events if e["type"] == "response.output_item.done"] == [item]
    assert events[-1]["response"]["output"] == [item]
    user = {"type": "message", "role": "user", "content": "task"}
    compacted = answer.compacted(rc.user_messages([user, {"type": "message", "role": "developer"}]))
    assert compacted["object"] == "response.compaction" and compacted["output"] == [user, item]


@pytest.mark.parametrize(
    "answer, base_url, answers",
    [
        ("auto", "https://api.openai.com/v1", "relay"),
        ("auto", "https://API.OpenAI.com/v1", "relay"),
        ("auto", "https://openrouter.ai/api/v1", "proxy"),
        ("auto", "http://127.0.0.1:8000/v1", "proxy"),
        ("proxy", "https://api.openai.com/v1", "proxy"),
        ("relay", "http://127.0.0.1:8000/v1", "relay"),
    ],
)
def test_who_answers_remote_compaction(answer: str, base_url: str, answers: str) -> None:
    settings = CompactSettings(answer=answer)  # type: ignore[arg-type]
    assert settings.answers(base_url) == answers
