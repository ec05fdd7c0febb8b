"""Canary: a policy on a sticky share of sessions, measured against the holdout, paused by a gate.

Pure: settings, the arm of a session, the figures of one request, the figures of an arm, and
the gate's verdict. The route asks for the arm, the ``CanaryRecord`` observer turns a finished
request into its figures, the store adds them up per session (shared by every replica on
Redis), and the ``CanaryJudge`` reads them back, judges, and pauses.

- **Arms.** A session is treated when a hash of the salt, the tenant and the session (the
  client's ``X-Session-Id``, else the conversation's root: tenant, system prompt and first
  user message) falls under ``share``: the same answer on every replica and every request.
  The holdout is forwarded exactly as ``full`` forwards it: the client's bytes.
- **Paused.** New sessions go to the holdout. A session already treated stays treated: its
  history may no longer fit the window uncompacted, and switching it back would break its
  prompt cache once more; it finishes under the policy, and its figures keep counting.
- **The gate** judges once each arm has ``min_sessions`` sessions. Error shares (per request)
  are hard limits: it breaches when the upper bound of the treated-minus-holdout difference
  passes the budget (once each arm has the requests such a bound needs: about z^2 / budget;
  before that, when even the lower bound passes it). Re-acquisition and cost per session are
  trade-offs: it breaches when the lower bound shows the treated arm worse than the budget
  allows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.canary.stats import Interval
from proxy.dialects.base import Usage

ARMS = ("treated", "holdout")
# Added per request to a session's figures (the store sums them).
COUNTED = (
    "requests",
    "prompt",
    "cached",
    "written",
    "output",
    "context_errors",
    "errors",
    "client_errors",
    "upstream_errors",
    "reads",
    "repeats",
    "agent_compactions",
    "cost",  # the prompt's and the compaction's own
    # The compaction's own: the summarizer's tokens (its points' and its preparations') and
    # their cost, apart from the prompt.
    "compaction_input",
    "compaction_output",
    "compaction_cost",
)


def arm_of(salt: str, tenant: str, session: str, share: float) -> str:
    digest = hashlib.blake2b(f"{salt}\x1f{tenant}\x1f{session}".encode(), digest_size=8).digest()
    return "treated" if int.from_bytes(digest, "big") / 2**64 < share else "holdout"


@dataclass(frozen=True, slots=True)
class Prices:
    """US dollars per million tokens, or None: then the cost is in full-price input tokens."""

    input: float | None = None
    cached_input: float | None = None
    cache_write: float | None = None
    output: float | None = None

    def cost(self, usage: Usage, *, cached_ratio: float, write_ratio: float) -> float:
        base = self.input if self.input is not None else 1.0
        cached = self.cached_input if self.cached_input is not None else base * cached_ratio
        written = self.cache_write if self.cache_write is not None else base * write_ratio
        output = self.output if self.output is not None else base * 4.0
        uncached = max(0, usage.prompt - usage.cached - usage.written)
        total = uncached * base + usage.cached * cached + usage.written * written + usage.output * output
        return total / 1e6 if self.input is not None else float(total)


def own_cost(input_tokens: int, output_tokens: int, summarizer: Prices, request: Prices) -> float:
    """The compaction's own tokens in the unit the request's cost is in: US dollars at the
    summarizer model's prices (the request model's where the summarizer has none); without a
    price for the request's model, full-price input tokens (output at four times the input)."""
    usage = Usage(prompt=input_tokens, output=output_tokens)
    if request.input is None:
        return Prices().cost(usage, cached_ratio=1.0, write_ratio=1.0)
    priced = summarizer if summarizer.input is not None else request
    return priced.cost(usage, cached_ratio=1.0, write_ratio=1.0)


@dataclass(slots=True)
class ArmFigures:
    arm: str
    sessions: list[Mapping[str, Any]] = field(default_factory=list)

    def total(self, key: str) -> float:
        return float(sum(s.get(key) or 0 for s in self.sessions))

    def per_session(self, key: str) -> list[float]:
        return [float(s.get(key) or 0) for s in self.sessions]

    def reacquisitions(self) -> list[float]:
        return [float((s.get("reads") or 0) + (s.get("repeats") or 0)) for s in self.sessions]

    def endings(self, now: float, idle_seconds: float) -> dict[str, int]:
        ended = {"answered": 0, "abandoned": 0, "active": 0}
        for s in self.sessions:
            if now - float(s.get("last") or 0) < idle_seconds:
                ended["active"] += 1
            else:
                ended["answered" if s.get("last_answer") == "final" else "abandoned"] += 1
        return ended

    def summary(self, now: float, idle_seconds: float) -> dict[str, Any]:
        count = len(self.sessions) or 1
        requests = self.total("requests")
        return {
            "sessions": len(self.sessions),
            "requests": int(requests),
            "requests_per_session": requests / count,
            "prompt_tokens": int(self.total("prompt")),
            "cached_prompt_tokens": int(self.total("cached")),
            "cache_write_tokens": int(self.total("written")),
            "output_tokens": int(self.total("output")),
            "context_errors": int(self.total("context_errors")),
            "errors": int(self.total("errors")),
            "client_errors": int(self.total("client_errors")),
            "upstream_errors": int(self.total("upstream_errors")),
            "reads_per_session": self.total("reads") / count,
            "reacquisitions_per_session": sum(self.reacquisitions()) / count,
            "agent_compactions": int(self.total("agent_compactions")),
            "compaction_input_tokens": int(self.total("compaction_input")),
            "compaction_output_tokens": int(self.total("compaction_output")),
            # The arm's cost is the prompt's and the compaction's own; each apart too.
            "prompt_cost_per_session": (self.total("cost") - self.total("compaction_cost")) / count,
            "compaction_cost_per_session": self.total("compaction_cost") / count,
            "cost_per_session": self.total("cost") / count,
            "endings": self.endings(now, idle_seconds),
        }


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    estimate: float
    interval: Interval
    budget: str
    breached: bool
    tenants: int = 1  # tenants compared (with sessions in both arms)

    def as_dict(self) -> dict[str, Any]:
        return {
            "check": self.name,
            "estimate": round(self.estimate, 6),
            "interval": [round(self.interval[0], 6), round(self.interval[1], 6)],
            "budget": self.budget,
            "breached": self.breached,
            "tenants": self.tenants,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    state: str  # waiting (too few sessions), pass, breach
    checks: tuple[Check, ...] = ()

    @property
    def breached(self) -> list[Check]:
        return [c for c in self.checks if c.breached]


def split_arms(sessions: Iterable[Mapping[str, Any]]) -> dict[str, ArmFigures]:
    arms = {arm: ArmFigures(arm) for arm in ARMS}
    for session in sessions:
        arm = arms.get(str(session.get("arm")))
        if arm is not None:
            arm.sessions.append(session)
    return arms
