"""The compacting route with a door the proxy does not ship (``toy_dialect.ToyDialect``), in the
graph ``proxy/app.py`` builds: a new wire format needs its adapter and nothing else. Each test
drives ``CompactingRoute.handle`` with a capturing ``send`` and reads what the client got, what
the upstream received, and the request's record (``Exchange``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from policies.handles import names_a_handle
from proxy.state.sessions import tenant_of
from tests.proxy.data_plane.toy_dialect import ToyDialect
from tests.proxy.data_plane.toy_proxy import (
    COUNTER,
    KEY,
    Served,
    answer,
    body,
    handles_in,
    reads_first_handle,
    toy_proxy,
)

TOY = ToyDialect()
# Unusual but valid JSON: spacing, key order and escapes a re-serialization would change.
ODD = b'{ "turns":[{"who":"user","say":"fix \\u00e9t\\u00e9 \\/ now","ts":1}] ,"model":"toy-1"}'


def compaction_headers(served: Served) -> dict[str, str]:
    return {
        k.decode(): v.decode() for k, v in served.client.headers.items() if k.startswith(b"x-compaction-")
    }


async def test_policy_and_mode_come_from_the_headers_else_the_settings(tmp_path: Path) -> None:
    async with toy_proxy(tmp_path, mode="shadow", policy="n_latest_10") as proxy:
        configured = await proxy.request(body(2))
        chosen = await proxy.request(
            body(2), headers={"X-Compaction-Policy": "improved", "X-Compaction-Mode": "enforce"}
        )
    assert (configured.exchange.policy, configured.exchange.mode) == ("n_latest_10", "shadow")
    assert compaction_headers(configured)["x-compaction-policy"] == "n_latest_10"
    assert compaction_headers(configured)["x-compaction-mode"] == "shadow"
    assert (chosen.exchange.policy, chosen.exchange.mode) == ("improved", "enforce")
    assert compaction_headers(chosen)["x-compaction-policy"] == "improved"
    assert chosen.exchange.session.endswith(":improved")


@pytest.mark.parametrize(
    ("header", "value", "code"),
    [
        ("X-Compaction-Policy", "no_such_policy", "unknown_policy"),
        ("X-Compaction-Mode", "loud", "unknown_mode"),
    ],
)
async def test_an_unknown_policy_or_mode_is_a_400_in_the_openai_shape(
    tmp_path: Path, header: str, value: str, code: str
) -> None:
    async with toy_proxy(tmp_path) as proxy:
        refused = await proxy.request(body(2), replies=[], headers={header: value})
        assert not proxy.upstream.requests
    assert refused.client.status == 400
    error = refused.client.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, header)
    assert repr(value) in error["message"]
    valid = "improved_tail, n_latest_10" if code == "unknown_policy" else "enforce, shadow, canary, off"
    assert valid in error["message"]


async def test_an_unknown_policy_is_a_400_in_the_anthropic_shape(tmp_path: Path) -> None:
    async with toy_proxy(tmp_path, anthropic=True) as proxy:
        refused = await proxy.request(body(2), replies=[], headers={"x-compaction-policy": "nope"})
        assert not proxy.upstream.requests
    assert refused.client.status == 400
    answered = refused.client.json()
    assert answered["type"] == "error" and answered["error"]["type"] == "invalid_request_error"
    assert "Unknown compaction policy 'nope'" in answered["error"]["message"]


async def test_mode_off_sends_the_clients_bytes_and_relays_the_answer_as_it_came(tmp_path: Path) -> None:
    raw = orjson.dumps(body(6)).replace(b'"turns":', b'"turns" :  ')  # over the window
    async with toy_proxy(tmp_path) as proxy:
        served = await proxy.request(raw, headers={"x-compaction-mode": "off"})
    (sent,) = served.requests
    assert sent.content == raw
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert "x-compaction-mode" not in sent.headers  # the proxy's own headers stay with it
    assert served.client.body == answer().body
    assert compaction_headers(served) == {"x-compaction-policy": "off", "x-compaction-mode": "off"}
    assert served.exchange.tokens_before is None and served.exchange.session == ""


@pytest.mark.parametrize("raw", [ODD, orjson.dumps(body(6))], ids=["odd-json", "agent-history"])
async def test_a_policy_that_changes_nothing_sends_the_bytes_with_the_compaction_headers(
    tmp_path: Path, raw: bytes
) -> None:
    async with toy_proxy(tmp_path, context_windows={"default": 200_000}) as proxy:
        served = await proxy.request(raw)
    (sent,) = served.requests
    assert sent.content == raw
    tokens = str(TOY.count(orjson.loads(raw), COUNTER))
    assert compaction_headers(served) == {
        "x-compaction-policy": "improved",
        "x-compaction-mode": "enforce",
        "x-compaction-tokens-before": tokens,
        "x-compaction-tokens-after": tokens,
    }
    assert served.exchange.mechanisms == () and served.exchange.trigger is None
    assert served.client.body == answer().body


async def test_a_compacted_request_sends_the_dialects_view(tmp_path: Path) -> None:
    client_body = body(8)
    async with toy_proxy(tmp_path, policy="n_latest_10", context_windows={"default": 128_000}) as proxy:
        served = await proxy.request(client_body)
    (view,) = served.sent
    turns = client_body["turns"]
    # The task and the ten latest turns, each exactly as the client sent it (its `ts` too).
    assert view["turns"] == [turns[0], *turns[-10:]]
    assert {k: v for k, v in view.items() if k != "turns"} == {
        k: v for k, v in client_body.items() if k != "turns"
    }
    headers = compaction_headers(served)
    assert headers["x-compaction-tokens-before"] == str(TOY.count(client_body, COUNTER))
    assert headers["x-compaction-tokens-after"] == str(TOY.count(view, COUNTER))
    assert int(headers["x-compaction-tokens-after"]) < int(headers["x-compaction-tokens-before"])
    assert "x-compaction-read-rounds" not in headers  # relayed: no handle named
    assert served.client.body == answer().body
    exchange = served.exchange
    assert exchange.mechanisms == ("n_latest",)
    assert (exchange.messages_before, exchange.messages_after) == (18, 12)


async def test_a_view_naming_a_saved_output_is_served_through_the_read_loop(tmp_path: Path) -> None:
    client_body = body(6)
    async with toy_proxy(tmp_path) as proxy:
        served = await proxy.request(
            client_body, replies=[reads_first_handle, answer("Offset is off by 4200.")]
        )
        first, second = served.sent
        handle = handles_in(served.requests[0])[0]
        stored = await proxy.parts.store.get_output(
            tenant_of([(b"authorization", f"Bearer {KEY}".encode())]), handle
        )
    # The first round offers the read tool after the agent's own tools.
    assert [t["name"] for t in first["tools"]] == ["execute_bash", "read_tool_output"]
    assert names_a_handle([{"role": "user", "content": orjson.dumps(first).decode()}])
    assert stored is not None and stored.content is not None and "test_offsets FAILED" in stored.content
    # The second round is the first with the model's read and its result appended.
    read_turn, result_turn = second["turns"][-2:]
    assert second["turns"][:-2] == first["turns"]
    assert read_turn["act"][0]["args"] == {"handle": handle, "pattern": "FAILED"}
    assert result_turn["re"] == "call_read" and "test_offsets FAILED offset=4200" in result_turn["say"]
    final = served.client.json()
    assert final["turn"]["say"] == "Offset is off by 4200." and final["turn"]["act"] == []
    # Usage over the rounds: the last round's prompt, every round's output.
    assert final["usage"] == {"in": 100, "out": 14, "all": 114}
    headers = compaction_headers(served)
    assert headers["x-compaction-read-rounds"] == "1" and headers["x-compaction-trigger"] == "threshold"
    assert int(headers["x-compaction-tokens-after"]) == max(TOY.count(b, COUNTER) for b in served.sent)
    assert served.exchange.read_rounds == 1 and served.exchange.reads is not None
    assert served.exchange.reads.reads == ["ok"]


async def test_shadow_mode_sends_the_clients_bytes_and_keeps_the_view_to_compare(tmp_path: Path) -> None:
    raw = orjson.dumps(body(6))
    overrides: dict[str, Any] = {"mode": "shadow", "shadow.compare": True, "shadow.sample_rate": 1.0}
    async with toy_proxy(tmp_path, **overrides) as proxy:
        served = await proxy.request(raw)
    (sent,) = served.requests
    assert sent.content == raw
    headers = compaction_headers(served)
    assert headers["x-compaction-mode"] == "shadow" and headers["x-compaction-trigger"] == "threshold"
    assert int(headers["x-compaction-tokens-after"]) < int(headers["x-compaction-tokens-before"])
    compare = served.exchange.compare
    assert compare is not None and compare.dialect == "toy" and compare.url == sent.url
    # The view the enforce mode would have sent: its saved outputs named, its size the header's.
    assert "handle=out_" in orjson.dumps(compare.body).decode()
    assert TOY.count(compare.body, COUNTER) == int(headers["x-compaction-tokens-after"])
    assert compare.captured == answer().body  # the real answer, for the comparison


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (
            orjson.dumps({"model": "toy-1", "turns": [{"who": "user", "say": 42}]}),
            "unreadable toy body (TypeError)",
        ),
        (b'{"model": "toy-1", "turns": [{"who": "user", "say": "t", "ts": NaN}]}', "NaN is not JSON"),
    ],
    ids=["type-error", "not-json"],
)
async def test_a_body_the_adapter_cannot_read_is_forwarded_as_sent(
    tmp_path: Path, raw: bytes, why: str
) -> None:
    async with toy_proxy(tmp_path) as proxy:
        served = await proxy.request(raw)
    (sent,) = served.requests
    assert sent.content == raw
    assert served.header("x-compaction-skipped") == why
    assert served.exchange.skipped == why and served.exchange.mechanisms == ()


async def test_the_exchange_holds_what_the_observers_read(tmp_path: Path) -> None:
    client_body = body(6)
    tenant = tenant_of([(b"authorization", f"Bearer {KEY}".encode())])
    async with toy_proxy(tmp_path) as proxy:
        served = await proxy.request(client_body, replies=[answer()])
        exchange = served.exchange
        exchange.seal()
        for observer in proxy.parts.observers:  # as the edge runs them, once the answer is out
            observer.observe(exchange)
        await asyncio.gather(*proxy.parts.events.pending)
        (event,) = await proxy.parts.store.events(tenant)
    assert (exchange.tenant, exchange.model, exchange.policy, exchange.status) == (
        tenant,
        "toy-1",
        "improved",
        200,
    )
    assert exchange.session.startswith("s_") and exchange.session.endswith(":improved")
    assert exchange.tokens_before == TOY.count(client_body, COUNTER)
    assert exchange.tokens_after == max(TOY.count(b, COUNTER) for b in served.sent)
    assert exchange.trigger == "threshold"
    assert set(exchange.mechanisms) >= {"offload", "verify_guidance"}
    assert exchange.outcome is not None and exchange.outcome.offloads and exchange.offloaded_bytes > 0
    assert exchange.dialect_notes == {"turns": 13}
    # The compaction event says the same.
    assert (event["session"], event["policy"], event["mode"]) == (exchange.session, "improved", "enforce")
    assert (event["tokens_before"], event["tokens_after"]) == (exchange.tokens_before, exchange.tokens_after)
    assert (event["trigger"], tuple(event["mechanisms"])) == ("threshold", exchange.mechanisms)
    assert event["handles_offloaded"] == sorted(exchange.outcome.offloads)


async def test_a_sessions_next_body_is_read_from_where_it_stops_repeating_the_last(tmp_path: Path) -> None:
    """The door names its history field; the route reads a session's next body from the known
    prefix, and the dialect is told how many leading turns were read (and found sound) before."""
    async with toy_proxy(tmp_path, policy="full") as proxy:
        first = await proxy.request(body(3), headers={"X-Session-Id": "s1"})
        second = await proxy.request(body(4), headers={"X-Session-Id": "s1"})
        other = await proxy.request(body(4), headers={"X-Session-Id": "s2"})
    assert "known_turns" not in first.exchange.dialect_notes
    # Three steps of two turns and the task: seven turns the first body had, all reused.
    assert second.exchange.dialect_notes["known_turns"] == len(body(3)["turns"])
    assert "known_turns" not in other.exchange.dialect_notes  # another conversation
    assert second.sent[0]["turns"] == body(4)["turns"]
