"""One tenant against the gate: whose doing an answer is, the comparison within each tenant,
each tenant's weight bounded, and a breach that must stand without any one tenant."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson

from proxy.canary.gate import ArmFigures, split_arms
from proxy.canary.outcome import outcome_kind
from proxy.canary.stats import (
    mean_difference,
    share_difference,
    weighted_mean_difference,
    weighted_share_difference,
)
from proxy.canary.store import SQLiteCanaryBook
from proxy.canary.verdict import MAX_TENANT_WEIGHT, capped_weights, judge
from proxy.config.sections import CanaryGate
from proxy.state.sqlite_store import SQLiteStore

BAD_PARAMETER = b'{"error":{"message":"Invalid value for \'temperature\'","param":"temperature"}}'
ORPHAN_TOOL = (
    b'{"error":{"message":"Invalid parameter: messages with role \'tool\' must be a response to a '
    b'preceeding message with \'tool_calls\'.","param":"messages.[3].role"}}'
)


def test_only_the_policys_doing_counts_against_an_arm() -> None:
    assert outcome_kind(200, None, b"{}") == "ok"
    assert outcome_kind(400, None, b'{"error":{"code":"context_length_exceeded"}}') == "context"
    # A compacted view the upstream finds malformed; the proxy's own failure.
    assert outcome_kind(400, None, ORPHAN_TOOL) == "view"
    assert (
        outcome_kind(400, None, b'{"error":{"message":"messages.3: tool_use ids without tool_result"}}')
        == "view"
    )
    assert outcome_kind(500, "internal_error", b"") == "view"
    # The client's own: a bad parameter, auth, a rate limit, a body too large, going away.
    for status in (400, 401, 403, 404, 422, 429):
        assert outcome_kind(status, None, BAD_PARAMETER) == "client", status
    assert outcome_kind(413, "request_too_large", b"") == "client"
    assert outcome_kind(200, "client_disconnected", b"") == "client"
    # The upstream's: a relayed 5xx, a timeout, a reset mid-stream.
    assert outcome_kind(503, None, b'{"error":{"message":"overloaded"}}') == "upstream"
    assert outcome_kind(504, "upstream_timeout", b"") == "upstream"
    assert outcome_kind(200, "upstream_reset", b"") == "upstream"


def sessions(tenant: str, arm: str, count: int, **figures: float) -> list[dict[str, Any]]:
    return [{"arm": arm, "tenant": tenant, "requests": 4, "cost": 1.0, **figures} for _ in range(count)]


def test_one_tenant_cannot_pause_the_policy_for_another() -> None:
    """The attack in the gate's terms: errors only in the attacker's treated sessions (here the
    kind a client can still make look like the view's: an orphan tool message)."""
    gate = CanaryGate()
    attacker = sessions("t_a", "treated", 35, errors=3) + sessions("t_a", "holdout", 35)
    victim = sessions("t_v", "treated", 30) + sessions("t_v", "holdout", 30)
    alone = judge(split_arms(attacker), gate)
    # A tenant alone in the figures is judged alone (as the whole pool was before).
    assert [c.name for c in alone.breached] == ["error_share"]
    both = judge(split_arms(attacker + victim), gate)
    assert both.state == "pass", both
    check = next(c for c in both.checks if c.name == "error_share")
    assert check.tenants == 2 and check.estimate > 0.05 and "without the tenant" in check.budget
    # Many more sessions do not buy the attacker more weight than the cap.
    big = sessions("t_a", "treated", 500, errors=3) + sessions("t_a", "holdout", 500)
    assert judge(split_arms(big + victim), gate).state == "pass"


def test_harm_seen_by_two_tenants_still_pauses() -> None:
    gate = CanaryGate()
    figures = []
    for tenant in ("t_1", "t_2", "t_3"):
        figures += sessions(tenant, "treated", 15, context_errors=2) + sessions(tenant, "holdout", 15)
    verdict = judge(split_arms(figures), gate)
    assert [c.name for c in verdict.breached] == ["context_error_share"]
    costly = []
    for tenant in ("t_1", "t_2"):
        costly += sessions(tenant, "treated", 30, cost=2.0) + sessions(tenant, "holdout", 30)
    assert [c.name for c in judge(split_arms(costly), gate).breached] == ["cost_per_session"]


def test_a_tenant_in_one_arm_only_has_no_comparison() -> None:
    gate = CanaryGate(min_sessions=10)
    figures = sessions("t_a", "treated", 20, errors=4) + sessions("t_b", "holdout", 20)
    assert judge(split_arms(figures), gate).state == "waiting"


def test_weights_are_capped_and_one_stratum_is_the_pooled_interval() -> None:
    weights = capped_weights({"a": 1000, "b": 10, "c": 10, "d": 10, "e": 10})
    assert weights["a"] == MAX_TENANT_WEIGHT and abs(sum(weights.values()) - 1) < 1e-9
    assert capped_weights({"a": 1000, "b": 10}) == {"a": 0.5, "b": 0.5}  # too few for the cap
    # Over the cap: its excess goes to the others in proportion.
    spread = capped_weights({"a": 3, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1})
    assert spread["a"] == 0.25 and all(abs(spread[t] - 0.15) < 1e-12 for t in "bcdef")
    assert weighted_share_difference([(5, 100, 1, 90)], [1.0]) == share_difference(5, 100, 1, 90)
    a, b = [1.0, 2.0, 5.0, 0.0], [1.0, 1.0, 3.0]
    assert weighted_mean_difference([(a, b)], [1.0], ratio=1.5) == mean_difference(a, b, ratio=1.5)


def test_sessions_read_back_carry_their_tenant_and_old_rows_load(tmp_path: Path) -> None:
    import asyncio

    async def run() -> list[dict[str, Any]]:
        store = SQLiteStore(tmp_path / "c.db")
        book = SQLiteCanaryBook(store)
        await book.add("t_new\x1fs1", "treated", {"requests": 1, "client_errors": 1}, None, 10.0)
        await store.close()
        # A row written before client_errors, upstream_errors and the tenant were read.
        with sqlite3.connect(tmp_path / "c.db") as db:
            old = {"arm": "holdout", "first": 5.0, "last": 5.0, "requests": 2, "errors": 1}
            db.execute(
                "INSERT INTO canary_sessions (key, arm, last, data) VALUES (?, ?, ?, ?)",
                ("t_old\x1fs0", "holdout", 5.0, orjson.dumps(old)),
            )
        store = SQLiteStore(tmp_path / "c.db")
        found = (await SQLiteCanaryBook(store).sessions(0.0)).sessions
        await store.close()
        return found

    found = sorted(asyncio.run(run()), key=lambda s: s["tenant"])
    assert [(s["tenant"], s["arm"]) for s in found] == [("t_new", "treated"), ("t_old", "holdout")]
    summary = ArmFigures("holdout", [found[1]]).summary(10.0, 600.0)
    assert summary["errors"] == 1 and summary["client_errors"] == 0 and summary["upstream_errors"] == 0
