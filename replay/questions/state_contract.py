"""What the state-contract kinds share: the user's own turns after the task, the statement
of a kind found among them, and the question built from it.

Only the user's words count: for agents that write actions as text, the user message that
answers an action is an observation (what a command printed), never an instruction; a harness
preamble is not the user's either. A statement counts when the whole turn is one of the
recognised sentences (``replay.inject.templates``): its reference is then read from the
turn, exactly, and needs no model. Anything else a user wrote is omitted, with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.conversation import is_harness_preamble, message_text, parse
from replay.inject.templates import Stated, statements
from replay.questions.question import CONTENT, Question
from replay.recording.cases import Case

NO_USER_TURN = "no user turn after the task"


def instruction_turns(case: Case) -> list[tuple[int, str]]:
    """(index, text) of each user turn after the task that holds the user's words: not a
    text-action observation, not a harness preamble."""
    conversation = parse(case.messages)
    turns: list[tuple[int, str]] = []
    for step in conversation.steps:
        if step.kind != "user" or step.start <= conversation.first_user:
            continue
        message = case.messages[step.start]
        if is_harness_preamble(message):
            continue
        turns.append((step.start, message_text(message)))
    return turns


def stated(case: Case, kind: str, turns: Sequence[tuple[int, str]] | None = None) -> Stated | str:
    """The latest user turn stating a ``kind`` (the latest statement is the one in force), or
    why there is none."""
    turns = list(instruction_turns(case) if turns is None else turns)
    if not turns:
        return NO_USER_TURN
    found = list(statements(turns, kind))
    if not found:
        label = kind.replace("_", " ")
        return f"no user turn states a {label} in a recognised form (no programmatic reference)"
    return found[-1]


def state_question(
    case: Case,
    kind: str,
    statement: Stated,
    *,
    prompt: str,
    reference: str,
    exact_items: Sequence[str] = (),
    stale: Sequence[str] = (),
) -> Question:
    """The question on one statement: its fact is the evidence, found in the turn itself."""
    fact = statement.fact
    return Question(
        question_id=f"{case.case_id}:{kind}",
        kind=kind,
        prompt=prompt,
        reference=reference,
        evidence=(fact,),
        exact_items=tuple(dict.fromkeys([fact, *exact_items])),
        source_messages=(statement.index,),
        evidence_in=(CONTENT,),
        stale=tuple(stale),
    )


def stale_presented(question: Question, view_text: str) -> bool:
    """The view (its text: ``replay.session.survival.view_text``, messages in order, one
    statement a line) presents a superseded value as the one in force: a line stating it
    without the value in force comes after every line holding that value (the correction
    absent, or only earlier: a wrong statement kept verbatim after a summary whose ledger holds
    the correction reads as newer than it)."""
    if not question.stale:
        return False
    last_stale = last_fact = -1
    for number, line in enumerate(view_text.splitlines()):
        if any(item in line for item in question.evidence):
            last_fact = number
        elif any(item in line for item in question.stale):
            last_stale = number
    return last_stale > last_fact
