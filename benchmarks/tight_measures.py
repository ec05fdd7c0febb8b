"""The measures of one tight-windows run, from what the fake model received and reported
(``tests/agent_upstream``), what the agent saw (``tight_agent``) and the proxy's events.

- compaction points: agent requests whose view (the first upstream request that served it,
  read rounds aside) rewrote the previous agent request's view before its final step (its
  tools, or a message before the previous view's last assistant message, differ);
  ``tail_changes``: requests that changed only the previous view's final step (an output
  put behind its handle in place), the rest of the view served from the cache;
  ``trigger_headers`` counts the answers that carried ``x-compaction-trigger`` (the proxy's
  own word for a point);
- cached shares: from ``usage.prompt_tokens_details.cached_tokens`` as the fake reported it
  (OpenAI's automatic prefix caching, ``tests/agent_upstream/prefix_cache.py``); the
  conversation's share leaves out the fixed prompt and the task (``fixed_and_task`` tokens);
- costs: prompt tokens at input prices (cached input 0.5 for gpt-4o, 0.25 for gpt-4.1), and
  Anthropic's rule (cache reads 0.1, writes 1.25; the client marks its last message as a
  breakpoint, and the proxy's Messages door marks the last message the policy wrote)
  simulated on block shapes by ``replay.session.cost``. Refused requests are not
  billed. Output tokens are not in the costs (``output_tokens`` gives them).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson
from tight_agent import AgentRun

from policies.tokens import REPLY_PRIMING, TokenCounter
from replay.session.cost import SessionLog, simulate
from tests.agent_upstream import Seen

OPENAI_CACHED = {"gpt-4o": 0.5, "gpt-4.1": 0.25}
ANTHROPIC_READ, ANTHROPIC_WRITE = 0.1, 1.25


def _digest(value: Any) -> bytes:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).digest()


def _views(requests: Sequence[Seen]) -> list[Seen]:
    """For each agent request, in order, the first accepted upstream request that was not a
    read follow-up: the view the proxy made of it."""
    first: dict[str, Seen] = {}
    for seen in requests:
        number = seen.headers.get("x-bench-request", "")
        if seen.kind != "rejected" and not seen.read_follow_up and number not in first:
            first[number] = seen
    return [first[k] for k in sorted(first, key=lambda k: int(k) if k.isdigit() else -1)]


def _final_step_start(messages: Sequence[Any]) -> int:
    """Where a view's final step starts: its last assistant message (the call whose results
    end the view), else its end."""
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], dict) and messages[index].get("role") == "assistant":
            return index
    return len(messages)


def compaction_points(requests: Sequence[Seen]) -> tuple[list[int], list[int], list[int]]:
    """The agent request numbers whose view rewrote the previous view before its final step
    (a compaction point: the provider's cache misses from there), those among them whose
    tool list changed, and the requests that changed only the previous view's final step (a
    tail change: everything before it is still served from the cache)."""
    points, tools_changed, tail_changes = [], [], []
    previous: tuple[bytes, list[bytes], int] | None = None
    for seen in _views(requests):
        tools = _digest(seen.body.get("tools"))
        body_messages = seen.body.get("messages") or []
        messages = [_digest(m) for m in body_messages]
        number = int(seen.headers.get("x-bench-request", "0"))
        if previous is not None:
            old_tools, old_messages, final = previous
            if tools != old_tools or messages[:final] != old_messages[:final]:
                points.append(number)
            elif messages[: len(old_messages)] != old_messages:
                tail_changes.append(number)
            if tools != old_tools:
                tools_changed.append(number)
        previous = (tools, messages, _final_step_start(body_messages))
    return points, tools_changed, tail_changes


_PROXY_WRITTEN = (
    "[Summary of the earlier conversation",
    "[Output saved outside the context",
    "[Output cut to fit",
)


def _proxy_breakpoint(messages: Sequence[Any]) -> int | None:
    """The message the Anthropic door marks with its own breakpoint: the last one the policy
    wrote (the summary, a placeholder, an excerpt; ``proxy/dialects/anthropic.py``)."""
    for index in range(len(messages) - 1, -1, -1):
        content = messages[index].get("content") if isinstance(messages[index], dict) else None
        if isinstance(content, str) and content.startswith(_PROXY_WRITTEN):
            return index
    return None


def anthropic_cost(requests: Sequence[Seen], counter: TokenCounter, horizon: int) -> float:
    """The accepted requests' prompts billed under Anthropic's rule, in full-price input tokens."""
    log = SessionLog()
    for seen in requests:
        body = seen.body
        encoding = counter.encoding_for(body.get("model"))
        messages = body.get("messages") or []
        head = (
            _digest([body.get("model"), body.get("tools")]),
            counter.count_tools(body.get("tools"), encoding),
        )
        blocks = [
            head,
            *zip((_digest(m) for m in messages), counter.count_messages(messages, encoding), strict=True),
        ]
        marked = _proxy_breakpoint(messages)
        breakpoints = () if marked is None else (marked + 1,)  # block 0 is the tools
        log.add("step_read" if seen.read_follow_up else "step", blocks, breakpoints, REPLY_PRIMING)
    total = 0.0
    for billed in simulate(log.shapes, "anthropic", horizon, client_breakpoint=True):
        assert billed is not None
        uncached = billed.prompt - billed.cached - billed.written
        total += uncached + ANTHROPIC_READ * billed.cached + ANTHROPIC_WRITE * billed.written
    return total


def read_outcomes(events: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Each read_tool_output read the proxy answered, by its outcome (ok, truncated, ...)."""
    found: Counter[str] = Counter()
    for event in events:
        record = event.get("read_tool_output") or {}
        found.update(str(outcome) for outcome in record.get("reads") or [])
    return dict(sorted(found.items()))


def measure(
    requests: Sequence[Seen],
    run: AgentRun,
    events: Sequence[dict[str, Any]],
    *,
    counter: TokenCounter,
    window: int,
    fixed_and_task: int,
    horizon: int,
) -> dict[str, Any]:
    accepted = [s for s in requests if s.kind != "rejected"]
    prompt = sum(s.tokens for s in accepted)
    cached = sum(s.cached for s in accepted)
    conversation = sum(max(0, s.tokens - fixed_and_task) for s in accepted)
    conversation_cached = sum(max(0, s.cached - fixed_and_task) for s in accepted)
    points, tools_changed, tail_changes = compaction_points(requests)
    agent_requests = len(run.requests)
    refused_agent = [r for r in run.requests if r.status != 200]
    return {
        "agent_requests": agent_requests,
        "steps": run.steps,
        "finished": run.finished,
        "upstream_requests": len(requests),
        "read_rounds": sum(1 for s in requests if s.read_follow_up),
        "reads_made": sum(1 for s in requests if s.kind == "read"),
        "read_outcomes": read_outcomes(events),
        "compaction_points": len(points),
        "compaction_point_requests": points,
        "points_per_agent_request": len(points) / agent_requests if agent_requests else 0.0,
        "views_with_changed_tools": tools_changed,
        "tail_changes": len(tail_changes),
        "trigger_headers": sum(1 for r in run.requests if "x-compaction-trigger" in r.headers),
        "triggers": dict(
            sorted(
                Counter(
                    r.headers.get("x-compaction-trigger")
                    for r in run.requests
                    if "x-compaction-trigger" in r.headers
                ).items()
            )
        ),
        "refused_for_window": len([s for s in requests if s.kind == "rejected"]),
        "agent_errors": [{"request": r.number, "status": r.status, "error": r.error} for r in refused_agent],
        "protocol_problems": sum(len(s.problems) for s in requests),
        "mismatched_commands": run.mismatched_commands,
        "window": window,
        "largest_request": max((s.budget for s in requests), default=0),
        "largest_agent_history": max((r.tokens for r in run.requests), default=0),
        "fixed_and_task_tokens": fixed_and_task,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": cached / prompt if prompt else 0.0,
        "conversation_cached_share": conversation_cached / conversation if conversation else 0.0,
        "output_tokens": sum((r.usage or {}).get("completion_tokens", 0) for r in run.requests),
        "cost": {
            **{name: prompt - cached + rate * cached for name, rate in OPENAI_CACHED.items()},
            "anthropic": anthropic_cost(accepted, counter, horizon),
        },
        "seconds": sum(r.seconds for r in run.requests),
        "per_agent_request": [
            {
                "number": r.number,
                "status": r.status,
                "history_tokens": r.tokens,
                **{k.removeprefix("x-compaction-"): v for k, v in sorted(r.headers.items())},
            }
            for r in run.requests
        ],
        "per_upstream_request": [
            {
                "kind": s.kind,
                "agent_request": s.headers.get("x-bench-request"),
                "tokens": s.tokens,
                "cached": s.cached,
                "offered_read": s.offered_read,
            }
            for s in requests
        ],
    }


def relative_costs(results: list[dict[str, Any]]) -> None:
    """Each run's costs relative to the ``full`` run of its scenario (``cost_vs_full``)."""
    reference = {r["scenario"]: r["cost"] for r in results if r["policy"] == "full"}
    for result in results:
        full = reference.get(result["scenario"])
        result["cost_vs_full"] = (
            {name: value / full[name] for name, value in result["cost"].items() if full[name]}
            if full
            else None
        )
