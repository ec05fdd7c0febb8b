"""The compaction service (``proxy/route/compaction.py``) called directly, in the graph ``proxy/app.py``
builds: which session a request belongs to (the conversation it extends, the client's
``X-Session-Id``, a fork where the history branches), the checkpoint a session keeps, offloads
stored before the outcome names them, a store that cannot write failing open, and requests
that bypass the policy. The neutral conversations are the toy door's (``toy_proxy.body``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from policies.handles import names_a_handle
from policies.pipeline import Offload, Policy
from policies.view import Context, View
from proxy.route.compaction import Compacted
from proxy.state.sessions import explicit_session, root_session
from proxy.state.sqlite_store import SQLiteStore
from tests.proxy.data_plane.toy_dialect import ToyDialect
from tests.proxy.data_plane.toy_proxy import ToyProxy, body, toy_proxy

TOY = ToyDialect()
TENANT = "t_service"
CLIENT = [(b"authorization", b"Bearer sk-service-000000")]
GIT_STATUS: list[dict[str, Any]] = [
    {
        "who": "agent",
        "say": None,
        "act": [{"id": "call_git", "tool": "execute_bash", "args": {"command": "git status"}}],
    },
    {
        "who": "tool",
        "re": "call_git",
        "say": "On branch main\nChanges not staged for commit:\n\tmodified: tidetime/parse.py",
    },
]
GIT_DIFF: list[dict[str, Any]] = [
    {
        "who": "agent",
        "say": None,
        "act": [{"id": "call_diff", "tool": "execute_bash", "args": {"command": "git diff"}}],
    },
    {
        "who": "tool",
        "re": "call_diff",
        "say": "diff --git a/tidetime/parse.py b/tidetime/parse.py\n-    offset = start + 4200",
    },
]


def history(steps: int = 6, then: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The neutral request of ``steps`` logged shell calls, then the ``then`` turns."""
    sent = body(steps)
    sent["turns"] += list(then)
    return TOY.parse(sent).neutral


async def compact(
    proxy: ToyProxy, neutral: dict[str, Any], session_id: str | None = None, **options: Any
) -> Compacted:
    headers = CLIENT + ([(b"x-session-id", session_id.encode())] if session_id else [])
    policy = options.pop("policy", proxy.parts.policies["improved"])
    return await proxy.parts.service.compact(
        neutral,
        policy=policy,
        tenant=TENANT,
        headers=headers,
        skipped=options.pop("skipped", None),
        **options,
    )


def errors(proxy: ToyProxy, kind: str) -> float:
    value = proxy.parts.metrics.registry.get_sample_value("compaction_proxy_errors_total", {"kind": kind})
    return value or 0.0


async def test_a_growing_history_keeps_its_session_and_the_decisions_of_its_checkpoint(
    tmp_path: Path,
) -> None:
    async with toy_proxy(tmp_path) as proxy:
        first = await compact(proxy, history(6))
        second = await compact(proxy, history(6, GIT_STATUS))
        await asyncio.gather(*proxy.parts.service.background)
        stored = await proxy.parts.store.load_checkpoint(TENANT, first.session)
    assert first.session == root_session(history(6), TENANT) + ":improved"
    assert second.session == first.session and second.session_fork is None
    one, two = first.outcome, second.outcome
    assert one.trigger == "threshold" and "offload" in one.mechanisms
    assert one.checkpoint.handles and (one.checkpoint.requests, one.checkpoint.compactions) == (1, 1)
    # The second request is no compaction point: the first's decisions are re-applied as they were.
    assert two.trigger is None and two.mechanisms == ("checkpoint",)
    assert (two.checkpoint.requests, two.checkpoint.compactions) == (2, 1)
    assert two.checkpoint.placeholders == one.checkpoint.placeholders
    assert two.checkpoint.handles == one.checkpoint.handles and not two.offloads
    assert one.messages is not None and two.messages is not None
    assert two.messages[: len(one.messages)] == one.messages  # the view grows by the new steps only
    assert two.messages[len(one.messages) :] == history(6, GIT_STATUS)["messages"][-2:]
    assert stored == one.checkpoint  # the compaction point's checkpoint, persisted


async def test_the_clients_session_id_names_the_session(tmp_path: Path) -> None:
    async with toy_proxy(tmp_path) as proxy:
        named = await compact(proxy, history(6), session_id="run-7")
        # Another conversation under the same id is the same session; the id is the client's word.
        other_task = history(6)
        other_task["messages"][1] = {"role": "user", "content": "Another task entirely."}
        same_id = await compact(proxy, other_task, session_id="run-7")
        other_id = await compact(proxy, history(6), session_id="run-8")
        derived = await compact(proxy, history(6))
        assert proxy.parts.service.sessions.checkpoint(named.session) is not None
    assert named.session == explicit_session(TENANT, "run-7") + ":improved"
    assert same_id.session == named.session and same_id.outcome.checkpoint.requests == 2
    assert other_id.session == explicit_session(TENANT, "run-8") + ":improved"
    assert derived.session == root_session(history(6), TENANT) + ":improved"
    assert len({named.session, other_id.session, derived.session}) == 3
    # Each session keeps its own checkpoint: run-8 and the derived session compact afresh.
    assert other_id.outcome.trigger == "threshold" and derived.outcome.trigger == "threshold"


async def test_a_history_that_branches_gets_its_own_session(tmp_path: Path) -> None:
    async with toy_proxy(tmp_path) as proxy:
        first = await compact(proxy, history(6))
        await compact(proxy, history(6, GIT_STATUS))
        # Another next step after the first request (a second run of the task, a retried step).
        sibling = await compact(proxy, history(6, GIT_DIFF))
        # An earlier message edited: no request of the session is a prefix of this one.
        edited = history(6)
        edited["messages"][3] = {**edited["messages"][3], "content": "(output cleared by the agent)"}
        rewritten = await compact(proxy, edited)
    assert len({first.session, sibling.session, rewritten.session}) == 3
    assert sibling.session_fork == {
        "parent": first.session,
        "common_messages": len(history(6)["messages"]),
        "inherited": True,
    }
    # The fork starts from its parent's checkpoint: the same decisions, no new compaction.
    assert sibling.outcome.trigger is None and sibling.outcome.mechanisms == ("checkpoint",)
    assert sibling.outcome.checkpoint.placeholders == first.outcome.checkpoint.placeholders
    assert rewritten.session_fork is None
    assert rewritten.outcome.trigger == "threshold" and "checkpoint" not in rewritten.outcome.mechanisms


async def test_offloads_are_stored_before_the_outcome_is_returned(tmp_path: Path) -> None:
    async with toy_proxy(tmp_path) as proxy:
        compacted = await compact(proxy, history(6))
        outcome = compacted.outcome
        stored = {h: await proxy.parts.store.get_output(TENANT, h) for h in outcome.offloads}
        elsewhere = await proxy.parts.store.get_output("t_other", next(iter(outcome.offloads)))
    assert outcome.messages is not None and names_a_handle(outcome.messages)
    named = {h for h in outcome.checkpoint.handles if h in orjson.dumps(outcome.messages).decode()}
    assert named and named <= set(stored)
    for handle, offload in outcome.offloads.items():
        saved = stored[handle]
        assert saved is not None and saved.content == offload.content
    assert elsewhere is None  # tenant-scoped


class FullDisk(SQLiteStore):
    async def put_outputs(self, tenant: str, outputs: Sequence[Offload]) -> None:
        raise OSError(28, "No space left on device")


async def test_a_store_that_cannot_write_fails_open(tmp_path: Path) -> None:
    async with toy_proxy(tmp_path, store=FullDisk(tmp_path / "full.db")) as proxy:
        compacted = await compact(proxy, history(6))
        kept = proxy.parts.service.sessions.checkpoint(compacted.session)
        assert errors(proxy, "store_write") == 1
        raw = orjson.dumps(body(6))
        served = await proxy.request(raw)
        assert errors(proxy, "store_write") == 2
    outcome = compacted.outcome
    # No view names a handle the store does not hold: the client's own request goes.
    assert outcome.messages is None and not outcome.offloads
    assert outcome.tokens_after == outcome.tokens_before == TOY.count(body(6), proxy.parts.counter)
    assert kept is None  # no checkpoint names handles that were never stored
    (sent,) = served.requests
    assert sent.content == raw and served.exchange.read_rounds == 0


class Refuses:
    """A stage that must never run."""

    name = "refuses"

    async def apply(self, view: View, ctx: Context) -> View:
        raise AssertionError("the policy ran on a skipped request")


async def test_a_skipped_request_bypasses_the_policy(tmp_path: Path) -> None:
    refuses = Policy(name="refuses", description="", stages=(Refuses(),))
    async with toy_proxy(tmp_path) as proxy:
        skipped = await compact(proxy, history(6), policy=refuses, skipped="lenient JSON")
        improved = await compact(proxy, history(6), skipped="a malformed history")
        assert not proxy.parts.service.sessions.checkpoint(root_session(history(6), TENANT) + ":improved")
    recording: dict[str, Any] = {"events.record_skipped": True}
    async with toy_proxy(tmp_path / "recorded", **recording) as proxy:
        recorded = await compact(proxy, history(6), skipped="lenient JSON")
    tokens = TOY.count(body(6), proxy.parts.counter)
    for compacted in (skipped, improved, recorded):
        outcome = compacted.outcome
        assert outcome.messages is None and outcome.mechanisms == () and not outcome.offloads
        assert (outcome.tokens_before, outcome.tokens_after) == (tokens, tokens)
        assert compacted.skipped is not None
    # Not recorded: no session at all; recorded: the session is named, the policy still not run.
    assert skipped.session == improved.session == ""
    assert recorded.session == root_session(history(6), TENANT) + ":improved"
