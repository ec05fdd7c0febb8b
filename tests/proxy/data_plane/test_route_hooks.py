"""The hooks a dialect adapter may write (``BaseDialect``'s do-nothing defaults), called by the
route and the read loop with no branch on the dialect's name: ``restore`` before the body is
read, ``upstream_headers`` for what goes upstream, ``read_loop_start``/``read_loop_end`` around
a read loop; and the adapter's stream codec serving a streamed read loop. The toy adapter here
keeps the read rounds its client never saw and puts them back when the client echoes the
answer, as the Anthropic adapter does (``proxy/dialects/hidden_rounds.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from proxy.state.sessions import tenant_of
from tests.proxy.data_plane.harness import Reply, sse_reply
from tests.proxy.data_plane.toy_dialect import ToyDialect, toy_event
from tests.proxy.data_plane.toy_proxy import (
    KEY,
    answer,
    body,
    handles_in,
    read_act,
    reads_first_handle,
    toy_proxy,
)

TENANT = tenant_of([(b"authorization", f"Bearer {KEY}".encode())])
NEXT = {"id": "call_next", "tool": "execute_bash", "args": {"command": "sed -n 40,60p tidetime/parse.py"}}
VIEW_HEADER = (b"x-toy-view", b"written-by-the-proxy")
Headers = list[tuple[bytes, bytes]]


class HookedToy(ToyDialect):
    """The toy door with every hook written, each call recorded."""

    def __init__(self) -> None:
        self.kept: dict[str, list[dict[str, Any]]] = {}  # read rounds by the answer's first call id
        self.restored: list[str] = []
        self.headers_for: list[bool] = []  # per upstream request: a body the proxy wrote?
        self.starts: list[int] = []
        self.ends: list[tuple[str, Any, dict[str, Any], Any]] = []

    async def restore(self, tenant: str, data: Any) -> tuple[Any, int]:
        self.restored.append(tenant)
        turns: list[dict[str, Any]] = []
        count = 0
        for turn in data["turns"]:
            acts = turn.get("act") or []
            rounds = self.kept.get(acts[0]["id"]) if turn["who"] == "agent" and acts else None
            if rounds:
                turns += rounds
                count += 1
            turns.append(turn)
        return ({**data, "turns": turns}, count) if count else (data, 0)

    def upstream_headers(self, headers: Headers, body: dict[str, Any] | None) -> Headers:
        self.headers_for.append(body is not None)
        return headers if body is None else [*headers, VIEW_HEADER]

    def read_loop_start(self, body: dict[str, Any]) -> Any:
        self.starts.append(len(body["turns"]))
        return len(body["turns"])

    async def read_loop_end(self, tenant: str, mark: Any, body: dict[str, Any], result: Any) -> None:
        self.ends.append((tenant, mark, body, result))
        if result.rounds and result.final_answer:
            self.kept[result.final_answer[0]["id"]] = body["turns"][mark:]


def echoed(answer_text: str = "Look at the parser.") -> dict[str, Any]:
    """The client's next request: its answer echoed (the read rounds it never saw are not in
    it), the call it made run."""
    sent = body(6)
    sent["turns"] += [
        {"who": "agent", "say": answer_text, "act": [NEXT]},
        {"who": "tool", "re": "call_next", "say": "40: offset = start + 4200  # FIXME"},
    ]
    return sent


async def test_the_loop_hooks_run_around_a_read_loop_and_restore_puts_its_rounds_back(tmp_path: Path) -> None:
    hooked = HookedToy()
    async with toy_proxy(tmp_path, hooked) as proxy:
        first = await proxy.request(
            body(6), replies=[reads_first_handle, answer("Look at the parser.", [NEXT])]
        )
        view, last = first.sent
        assert first.client.json()["turn"]["act"] == [NEXT]  # the client sees the last round only
        assert hooked.starts == [len(view["turns"])]
        ((tenant, mark, ended, result),) = hooked.ends
        assert (tenant, mark, ended) == (TENANT, len(view["turns"]), last)
        assert (result.rounds, result.status, result.final_answer) == (1, 200, [NEXT])
        hidden = last["turns"][mark:]
        assert [t["who"] for t in hidden] == ["agent", "tool"] and hidden[0]["act"][0][
            "tool"
        ] == "read_tool_output"

        second = await proxy.request(echoed())
    assert hooked.restored == [TENANT, TENANT]
    (sent,) = second.sent
    at = next(i for i, t in enumerate(sent["turns"]) if t.get("act") == [NEXT])
    # Upstream, the echoed answer follows the read round it was written after.
    assert sent["turns"][at - 2 : at] == hidden
    assert sent["turns"][at:] == echoed()["turns"][-2:]
    assert second.exchange.dialect_notes["restored_read_rounds"] == 1
    assert second.exchange.messages_before == len(echoed()["turns"]) + 1 + len(hidden)


async def test_upstream_headers_are_added_to_the_bodies_the_proxy_writes_only(tmp_path: Path) -> None:
    hooked = HookedToy()
    async with toy_proxy(tmp_path, hooked, policy="n_latest_10") as proxy:
        as_sent = await proxy.request(body(8), headers={"x-compaction-mode": "off"})
        compacted = await proxy.request(body(8))
    (plain,) = as_sent.requests
    (view,) = compacted.requests
    assert VIEW_HEADER[0].decode() not in plain.headers
    assert view.headers[VIEW_HEADER[0].decode()] == VIEW_HEADER[1].decode()
    assert view.headers["authorization"] == f"Bearer {KEY}"  # the hook got the provider's headers
    assert hooked.headers_for == [False, True]
    assert hooked.restored == [TENANT]  # mode off reads nothing


async def test_restored_rounds_reach_the_upstream_when_the_policy_changes_nothing(tmp_path: Path) -> None:
    hooked = HookedToy()
    hidden: list[dict[str, Any]] = [
        {"who": "agent", "say": None, "act": [read_act("out_00000000000000a1")]},
        {"who": "tool", "re": "call_read", "say": "151| test_offsets FAILED offset=4205"},
    ]
    hooked.kept["call_next"] = hidden
    async with toy_proxy(tmp_path, hooked, context_windows={"default": 200_000}) as proxy:
        served = await proxy.request(echoed())
    assert served.exchange.dialect_notes["restored_read_rounds"] == 1  # restore() was called and counted
    (sent,) = served.sent
    assert sent["turns"][-4:-2] == hidden


def streamed_read(request: httpx.Request) -> Reply:
    act = read_act(handles_in(request)[0])
    return sse_reply(
        [toy_event({"act": act}), toy_event({"usage": {"in": 900, "out": 9}}), toy_event({"done": True})]
    )


async def test_a_streamed_read_loop_is_relayed_through_the_adapters_codec(tmp_path: Path) -> None:
    final = [
        toy_event({"say": "The offset "}),
        toy_event({"say": "is off by 4200."}),
        toy_event({"act": NEXT}),
        toy_event({"usage": {"in": 1000, "out": 12}}),
        toy_event({"done": True}),
    ]
    async with toy_proxy(tmp_path) as proxy:
        served = await proxy.request(body(6, stream=True), replies=[streamed_read, sse_reply(final)])
    first, second = served.sent
    assert first["stream"] is True and second["turns"][-1]["re"] == "call_read"
    assert "test_offsets FAILED" in second["turns"][-1]["say"]
    client = served.client
    assert client.status == 200 and client.complete
    assert client.headers[b"x-compaction-read-rounds"] == b"1"
    assert client.events() == [
        {"say": "The offset "},
        {"say": "is off by 4200."},
        {"act": NEXT},
        {"usage": {"in": 1000, "out": 21, "all": 1021}},
        {"done": True},
    ]
    assert b"read_tool_output" not in client.body
    assert first["tools"][-1]["name"] == "read_tool_output"
