"""The built-in policies, as plain configuration (what ``policies:`` in ``config.yml`` holds):
the reference arm, the N-latest arms, the SRE agent's compaction as shipped, and the ablation
sequence that adds one improvement at a time up to ``improved``. The proxy's settings validate
them like any user's policy."""

from __future__ import annotations

from typing import Any


def _policy(description: str, stages: list[dict[str, Any]], *, safeguard: bool = True) -> dict[str, Any]:
    return {"description": description, "stages": stages, "safeguard": safeguard}


def builtin_policy_table() -> dict[str, dict[str, Any]]:
    """Every built-in policy: its description, stages and whether the token safeguard ends it."""
    policies = {
        "full": _policy("History unchanged: the reference arm.", [], safeguard=False),
    }
    for n in (10, 20, 40):
        policies[f"n_latest_{n}"] = _policy(
            f"The {n} latest history messages, cut where no tool exchange is split.",
            [{"n_latest": {"n": n}}],
        )
    policies["sre"] = _policy(
        "sre-agent as shipped: micro_compact, then auto_compact at 0.8 x window.",
        [
            {"micro_compact": {"min_chars": 500, "keep_recent": 5}},
            {"auto_compact": {"trigger": 0.8, "prompt": "sre"}},
        ],
    )
    # The ablation sequence: each mechanism added one at a time, so each one's effect is measured alone.
    trigger = {"trigger": {"high": 0.75}}
    # `improved`'s trigger is timed by the provider's prompt cache (prompt_cache in the config):
    # a session back after its cache expired compacts from 0.6; one whose prefix was just
    # written waits a request unless the window requires.
    timed_trigger = {"trigger": {"high": 0.75, "cold_high": 0.6, "write_grace": 1}}
    # The ablation arms keep one mechanism per step: transcripts (on by default) come with `improved`.
    cut = {"target": 0.5, "retained_tail": 0.2, "prompt": "hybrid_v2"}
    message_cut = {"summarize": {**cut, "step_aware": False, "save_transcript": False}}
    step_cut = {"summarize": {**cut, "step_aware": True, "save_transcript": False}}
    # `improved` saves what each summary replaces, verbatim (one transcript per compaction).
    transcript_cut = {"summarize": {**cut, "step_aware": True}}
    offload = {
        "offload": {"min_tokens": 1000, "keep_recent": 5, "clear_min_chars": 500, "keep_recent_steps": 1}
    }
    retry = {"retry_collapse": {"min_attempts": 2}}
    # Between points of a tight session, outputs behind their handles as soon as they are not
    # the newest (the steady state at small windows; nothing changes in a roomy one).
    tail = {"tail_offload": {"min_chars": 500, "keep_recent_steps": 1, "min_argument_tokens": 250}}
    ablation: dict[str, tuple[str, list[dict[str, Any]]]] = {
        "improved_tail": ("Retained tail (0.2 of the window) with message cuts.", [trigger, message_cut]),
        "improved_step": ("+ step-aware cuts.", [trigger, step_cut]),
        "improved_offload": ("+ output offloading with handles.", [trigger, offload, step_cut]),
        "improved_retry": ("+ settled-retry collapse.", [trigger, retry, offload, step_cut]),
    }
    for name, (description, stages) in ablation.items():
        policies[name] = _policy(description, stages)
    # Superseded and stale reads (an output a later step made obsolete -> a note with its
    # handle), a warm prefix rewritten only when it pays, every one when the cache has expired:
    # on the 68 sample trajectories at 128k, 22.5% fewer prompt tokens at equal survival
    # (policies/README.md has the tables).
    superseded: dict[str, Any] = {
        "superseded_reads": {
            "min_chars": 300,
            "commands": True,
            "stale_newest": False,
            "cache_aware": True,
            "payback": 1.0,
        }
    }
    guidance: dict[str, Any] = {"verify_guidance": {}}
    every: list[dict[str, Any]] = [tail, timed_trigger, retry, superseded, offload, transcript_cut, guidance]
    policies["improved"] = _policy(
        "Every improvement: retry collapse, superseded and stale reads, offloading, step-aware cut "
        "with a retained tail, summary plus state ledger, transcripts of what each summary "
        "replaces, verify guidance, outputs behind their handles at the tail when the window is "
        "tight, and compaction timed by the provider's prompt cache.",
        every,
    )
    policies["improved_no_superseded"] = _policy(
        "improved without superseded_reads: what they save, measured alone.",
        [stage for stage in every if stage is not superseded],
    )
    return policies
