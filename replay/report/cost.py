"""The effective cost in the reports: the main table's cost columns, how the costs were
computed, and with model arms the cost per successful answer (``replay.report.cost_figures``)."""

from __future__ import annotations

from typing import Any

from replay.report.cost_figures import per_successful_answer

# The effective cost is the prompt's and the compaction's own (the summarizer's tokens of its
# points and its preparations, at the summarizer's prices), each shown apart; what is saved
# against the full arm is net of the compaction's own.
COST_HEADER = [
    "cache hit",
    "prompt cost (mean/case)",
    "compaction's own cost (mean/case)",
    "effective cost (mean/case)",
    "saved vs full, net (mean/case)",
    "vs full",
]


def _tokens(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def cost_cells(arm: dict[str, Any]) -> list[str]:
    cost = arm.get("cost")
    if not cost:
        return ["n/a"] * len(COST_HEADER)
    share, versus = cost.get("cache_hit_share"), cost.get("effective_vs_full")
    return [
        "n/a" if share is None else f"{share:.0%}",
        # A results.json written before the split has only the total (n/a for the parts).
        _tokens(cost.get("prompt_effective_tokens_mean")),
        _tokens(cost.get("compaction_effective_tokens_mean")),
        _tokens(cost["effective_input_tokens_mean"]),
        _tokens(cost.get("saved_vs_full_mean")),
        "n/a" if versus is None else f"{versus:.2f}",
    ]


def _rule(note: dict[str, Any]) -> str:
    horizon = note["horizon_requests"]
    ttl = note.get("ttl_seconds")
    # Runs before the simulated clock have no lifetime in their note.
    horizon = f"{horizon} (used within {ttl:g} s of simulated time)" if ttl else horizon
    if note["rule"] == "openai":
        return (
            "the OpenAI rule: a request's longest common prefix (the tool schemas, then whole "
            f"messages) with any of the last {horizon} requests of its case session, counted from "
            f"{note['min_cached_tokens']:,} tokens on in {note['increment']}-token steps"
        )
    if note["rule"] == "anthropic":
        client = "; the client marks its last message" if note.get("client_breakpoint") else ""
        return (
            "the Anthropic rule: a request reads the longest prefix cached at one of its "
            "cache_control breakpoints (or up to 20 messages before one) by one of the last "
            f"{horizon} requests of its case session, and writes the prefixes of "
            f"{note['min_cached_tokens']:,} tokens or more up to its breakpoints{client}"
        )
    return "no prompt cache"


def cost_note(results: dict[str, Any]) -> str:
    """One paragraph: the rule, the rates, and why an arm has no cost."""
    note = results["run"].get("cost")
    if not note:
        return ""
    if "rule" not in note:
        return f"Cost: n/a ({note.get('missing', 'not computed')})."
    rates = note["rates"]
    writes = f" + cache writes x {rates['cache_write']}" if note["rule"] == "anthropic" else ""
    text = (
        f"Cost: prompt caching simulated with {_rule(note)}. Effective cost in full-price input "
        f"tokens (rates from prices {note['prices_from']}): the prompt cost (uncached prompt "
        f"tokens + cached x {rates['cached_input']}{writes}) plus the compaction's own cost (the "
        "summarizer's tokens of its points and of its preparations, used or not: input x "
        f"{rates['summarizer_input']} + output x {rates['summarizer_output']}), over every step "
        "of the case, mean per case; saved vs full = the full arm's effective cost less the arm's, "
        "so net of the compaction's own cost; vs full = ratio to the full arm's; cache hit = "
        "cached / prompt tokens. Prefixes are compared in whole messages, so a rewritten message "
        "misses from its first token."
    )
    if note.get("missing"):
        text += f" Cost n/a: {note['missing']}."
    return text


def per_success_table(results: dict[str, Any]) -> list[list[str]]:
    """Model arms: the effective cost of one correct answer, the trajectory included per run."""
    rows = [["arm", "answering runs", "correct / graded", "effective cost per correct answer"]]
    for name, arm in results["arms"].items():
        questions = [q for q in results["questions"] if q.get("arm") == name]
        figure = per_successful_answer(arm.get("cost"), questions)
        if figure is None:
            continue
        value = figure["effective_input_tokens"]
        rows.append(
            [
                name,
                str(figure["runs"]),
                f"{figure['correct']} / {figure['graded']}",
                "n/a (none correct)" if value is None else f"{value:,.0f}",
            ]
        )
    return rows if len(rows) > 1 else []
