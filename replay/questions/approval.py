"""``approval``: an action the user explicitly allowed ("Approved: you may delete `f`"),
stated in a user turn after the task.

The evidence is the approved action's exact target (the file), which appears in no other
message of the run.
"""

from __future__ import annotations

from collections.abc import Sequence

from replay.questions.question import Question
from replay.questions.state_contract import state_question, stated
from replay.recording.cases import Case

PROMPT = (
    "Which actions has the user explicitly approved that you would otherwise need permission "
    "for? Name each action and its exact target."
)


def approval_question(case: Case, turns: Sequence[tuple[int, str]] | None = None) -> Question | str:
    """The question, or why it is omitted."""
    statement = stated(case, "approval", turns)
    if isinstance(statement, str):
        return statement
    return state_question(
        case,
        "approval",
        statement,
        prompt=PROMPT,
        reference=statement.template.render(statement.values),
    )
