"""A view whose last items are the client's own goes out with those items' bytes as the client
sent them, and the body the upstream reads is exactly the view's."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.route.known_bodies import KnownBodies, KnownBody
from proxy.route.wire_bytes import MIN_SPLICED_BYTES, client_tail, encode_view
from proxy.wire.json_body import dump_json
from tests.proxy.json_styles import STYLES, dump


def step(i: int, text: str = "x") -> list[dict[str, Any]]:
    call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{i}", "content": f"{text} é 日本 \u2028 {i} " * 40},
    ]


def history(steps: int) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix it."}]
    for i in range(steps):
        messages += step(i)
    return messages


def read(bodies: KnownBodies, messages: list[Any], style: str = "spaced") -> tuple[dict[str, Any], KnownBody]:
    body = dump({"model": "gpt-4o", "messages": messages, "stream": True}, style)
    parsed = bodies.parse(b"conversation", body, "messages")
    assert parsed.record is not None
    return parsed.data, parsed.record


def view_of(data: dict[str, Any], keep_last: int) -> dict[str, Any]:
    """A compacted view: the head, a placeholder for what was cut, the client's last items."""
    items = data["messages"]
    placeholder = {"role": "user", "content": "[3 earlier steps offloaded: handle=out_1]"}
    return {**data, "messages": [*items[:2], placeholder, *items[-keep_last:]], "tools": [{"name": "read"}]}


def test_the_client_items_go_as_the_client_wrote_them() -> None:
    data, record = read(KnownBodies(), history(6))
    view = view_of(data, 4)
    sent = encode_view(view, record, verify=True)
    assert orjson.loads(sent) == orjson.loads(dump_json(view))
    # The client's own spacing (json.dumps's ", " and ": ") is in the body: its bytes were copied.
    client_bytes = json.dumps(data["messages"][-4:], ensure_ascii=False)[1:-1].encode()
    assert client_bytes in sent
    assert sent != dump_json(view)


def test_items_appended_together_are_cut_where_the_record_knows_an_end() -> None:
    bodies = KnownBodies()
    read(bodies, history(6))
    data, record = read(bodies, history(7))  # the step's two items, appended as one run
    assert record.reused == 14 and record.ends[-1] == record.ends[-2]
    # The view keeps the new step's output but not its call: the run cannot start inside the
    # two items read together, so it starts at the next end the record knows (none: encoded).
    assert client_tail(view_of(data, 1)["messages"], record) is None
    # The last 5: three items the first (whole) parse recorded one by one, then the run.
    view = view_of(data, 5)
    start, run = client_tail(view["messages"], record) or (0, b"")
    assert start == 3  # after the head (2) and the placeholder
    assert orjson.loads(b"[" + run + b"]") == data["messages"][-5:]
    assert orjson.loads(encode_view(view, record, verify=True)) == orjson.loads(dump_json(view))


def test_a_view_that_does_not_end_with_the_client_items_is_encoded_whole() -> None:
    data, record = read(KnownBodies(), history(6))
    view = view_of(data, 4)
    later_round = {**view, "messages": [*view["messages"], {"role": "tool", "content": "read"}]}
    assert encode_view(later_round, record) == dump_json(later_round)
    assert encode_view(view, None) == dump_json(view)


def test_a_short_run_is_encoded_with_the_rest() -> None:
    messages = history(1)
    messages[-1]["content"] = "ok"
    data, record = read(KnownBodies(), messages)
    view = view_of(data, 2)
    assert len(json.dumps(data["messages"][-2:])) < MIN_SPLICED_BYTES
    assert encode_view(view, record) == dump_json(view)


def test_the_head_is_encoded_once_between_compaction_points() -> None:
    bodies = KnownBodies()
    data, record = read(bodies, history(6))
    placeholder = {"role": "user", "content": "[offloaded: handle=out_1]"}

    def view(data: dict[str, Any], keep: int) -> dict[str, Any]:
        return {**data, "messages": [*data["messages"][:2], placeholder, *data["messages"][-keep:]]}

    first = view(data, 4)
    encode_view(first, record, verify=True)
    assert record.sent_head is not None
    head_json = record.sent_head[1]
    data, record = read(bodies, history(7))  # the next step: the same head objects, two more items
    assert record.sent_head is not None and record.sent_head[1] is head_json
    second = view(data, 6)
    assert orjson.loads(encode_view(second, record, verify=True)) == orjson.loads(dump_json(second))
    assert record.sent_head[1] is head_json  # taken as it was
    # An equal but different object (1 == True in Python, not in JSON) is encoded again.
    placeholder = {"role": "user", "content": "[offloaded: handle=out_1]", "n": True}
    first_n = {
        **second,
        "messages": [*second["messages"][:2], {**placeholder, "n": 1}, *second["messages"][3:]],
    }
    encode_view(first_n, record)
    true_n = {**second, "messages": [*second["messages"][:2], placeholder, *second["messages"][3:]]}
    assert orjson.loads(encode_view(true_n, record))["messages"][2]["n"] is True


def test_verification_catches_an_item_changed_in_place() -> None:
    data, record = read(KnownBodies(), history(6))
    view = view_of(data, 4)
    data["messages"][-1]["content"] = "changed after it was read"
    with pytest.raises(AssertionError):
        encode_view(view, record, verify=True)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(st.integers(1, 3), min_size=1, max_size=5),
    keep=st.integers(0, 12),
    first=STYLES,
    later=STYLES,
)
def test_any_spliced_view_is_the_view(steps: list[int], keep: int, first: str, later: str) -> None:
    """Bodies growing by runs of steps in any JSON style; a view keeping any number of the last
    items after a placeholder is read back as exactly the view."""
    bodies, count = KnownBodies(), 0
    for index, added in enumerate(steps):
        count += added
        data, record = read(bodies, history(count), first if index == 0 else later)
        view = view_of(data, min(keep, len(data["messages"]) - 2) or 1)
        assert orjson.loads(encode_view(view, record, verify=True)) == orjson.loads(dump_json(view))
