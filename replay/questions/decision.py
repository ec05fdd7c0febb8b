"""``decision``: a choice the user confirmed as settled ("we decided to use `A` instead of
`B` for X; stick with it"), stated in a user turn after the task. Decisions are usually the
agent's own and are then not certain enough to ask about; a user-confirmed one is.

The evidence is the chosen option; the rejected one is part of the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

from replay.questions.question import Question
from replay.questions.state_contract import state_question, stated
from replay.recording.cases import Case

PROMPT = (
    "Which design decision did the user confirm as settled for this task? Name the option "
    "chosen, what it replaces, and where it applies."
)


def decision_question(case: Case, turns: Sequence[tuple[int, str]] | None = None) -> Question | str:
    """The question, or why it is omitted."""
    statement = stated(case, "decision", turns)
    if isinstance(statement, str):
        return statement
    chosen, rejected = statement.fact, statement.values["rejected"]
    component = statement.values["component"]
    return state_question(
        case,
        "decision",
        statement,
        prompt=PROMPT,
        reference=f"`{chosen}` instead of `{rejected}`, for {component}",
    )
