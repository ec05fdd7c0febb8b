"""Policy stages, one mechanism per file, listed explicitly: a stage exists because it is
named here, not because a module was imported."""

from __future__ import annotations

from policies.stages.auto_compact import AutoCompact
from policies.stages.micro_compact import MicroCompact
from policies.stages.n_latest import NLatest
from policies.stages.offload import OffloadOutputs
from policies.stages.retry_collapse import RetryCollapse
from policies.stages.summarize import Summarize
from policies.stages.superseded_reads import SupersededReads
from policies.stages.tail_offload import TailOffload
from policies.stages.token_safeguard import TokenSafeguard
from policies.stages.trigger import Trigger
from policies.stages.verify_guidance import VerifyGuidance

STAGE_TYPES: dict[str, type] = {
    "n_latest": NLatest,
    "micro_compact": MicroCompact,
    "auto_compact": AutoCompact,
    "trigger": Trigger,
    "retry_collapse": RetryCollapse,
    "superseded_reads": SupersededReads,
    "offload": OffloadOutputs,
    "tail_offload": TailOffload,
    "summarize": Summarize,
    "verify_guidance": VerifyGuidance,
    "token_safeguard": TokenSafeguard,
}

__all__ = ["STAGE_TYPES"]
