"""What a policy's stages tell every request's ``Context``: settings one stage owns but others
need (whether the policy summarizes, the summarizing stage's ledger share, the token safeguard's
reserve and read room, whether edits and transcripts are saved). Read once, when the policy is
built, instead of searching its stages on every request."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.view import Stage

# Stages that summarize history (a policy with one keeps a summary the safeguard can extend).
SUMMARIZING = frozenset({"summarize", "auto_compact"})


@dataclass(frozen=True, slots=True)
class PolicyTraits:
    """What the stages of a policy tell every request's ``Context`` (read once per policy)."""

    summarizes: bool
    ledger_share: float
    reserve_tokens: int
    safeguard: Any
    edit_artifacts: bool
    transcripts: bool


def policy_traits(stages: tuple[Stage, ...]) -> PolicyTraits:
    """Settings one stage owns but others need: the summarizing stage's ledger share, the
    safeguard's reserve and read room, whether edits and transcripts are saved."""
    safeguard: Any = next((s for s in stages if s.name == "token_safeguard"), None)
    return PolicyTraits(
        summarizes=any(stage.name in SUMMARIZING for stage in stages),
        ledger_share=next(
            (float(getattr(s, "ledger_share", 0.1)) for s in stages if s.name in SUMMARIZING), 0.1
        ),
        reserve_tokens=int(getattr(safeguard, "reserve_tokens", 1024)),
        safeguard=safeguard,
        edit_artifacts=any(getattr(stage, "offload_arguments", False) for stage in stages),
        transcripts=any(getattr(stage, "save_transcript", False) for stage in stages),
    )
