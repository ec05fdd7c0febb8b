"""What a question is: the record every kind builds, and the rules for quoting evidence.

Shared by every kind's module (``files_changed``, ``first_edit``, ``command_output``,
``error``, and the state-contract kinds) so that each quotes a line the same way and marks
where its evidence sits.
"""

from __future__ import annotations

from dataclasses import dataclass

# The kinds asked by default: what any recorded run can be asked about.
KINDS = ("files_changed", "first_edit", "command_output", "error")
# The state contract: what the user set (constraints, corrections, deferred
# instructions, approvals, decisions). Real runs rarely state them, so these are asked where a
# user turn states one in a recognised form, which the injection suite (replay.inject.injection) adds.
STATE_KINDS = ("constraint", "correction", "deferred_instruction", "approval", "decision")
ALL_KINDS = (*KINDS, *STATE_KINDS)

# Where an evidence string sits: a message's content (tool result, observation, assistant
# text with text actions) or the parsed argument values of a native tool call.
CONTENT = "content"
ARGUMENTS = "arguments"

MAX_LINE_CHARS = 200
# A line longer than MAX_LINE_CHARS is quoted by this many leading characters.
LONG_LINE_PREFIX = 120


@dataclass(frozen=True, slots=True)
class Question:
    question_id: str  # f"{case_id}:{kind}" (unique per case)
    kind: str  # one of ALL_KINDS
    prompt: str  # the user message appended to the final history
    reference: str  # the reference answer (human-readable)
    evidence: tuple[str, ...]  # verbatim strings the answer depends on
    exact_items: tuple[str, ...]  # what a deterministic checker can look for in an answer
    source_messages: tuple[int, ...]  # indices of the case messages the evidence comes from
    # Per evidence string: CONTENT (a message's content) or ARGUMENTS (parsed values of a
    # native tool call's arguments).
    evidence_in: tuple[str, ...] = ()
    # Superseded values (a correction's earlier wrong one): presented without the evidence,
    # the view states something stale as current (``replay.questions.stale_presented``).
    stale: tuple[str, ...] = ()


def evidence_line(line: str) -> str:
    """A line as evidence: whole, or a distinctive prefix if very long."""
    line = line.strip()
    return line if len(line) <= MAX_LINE_CHARS else line[:LONG_LINE_PREFIX].rstrip()
