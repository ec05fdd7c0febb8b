"""``constraint``: a limit the user set on the work (a part of the repository not to touch,
an API to keep), stated in a user turn after the task.

The evidence is the constraint's exact target (the protected directory), which appears in no
other message of the run; the reference is the user's sentence.
"""

from __future__ import annotations

from collections.abc import Sequence

from replay.questions.question import Question
from replay.questions.state_contract import state_question, stated
from replay.recording.cases import Case

PROMPT = (
    "Which constraints did the user set for this task that still apply? Quote each one exactly "
    "as the user stated it, including every path and module name it names, one per line."
)


def constraint_question(case: Case, turns: Sequence[tuple[int, str]] | None = None) -> Question | str:
    """The question, or why it is omitted."""
    statement = stated(case, "constraint", turns)
    if isinstance(statement, str):
        return statement
    module = statement.values.get("module")
    return state_question(
        case,
        "constraint",
        statement,
        prompt=PROMPT,
        reference=statement.template.render(statement.values),
        exact_items=[module] if module else [],
    )
