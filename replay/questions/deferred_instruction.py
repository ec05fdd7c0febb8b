"""``deferred_instruction``: something the user asked to be done at a later boundary ("when
you are done, also add a CHANGELOG entry mentioning ticket X"), stated in a user turn.

The evidence is the exact identifier the deferred action must carry (the ticket id).
"""

from __future__ import annotations

from collections.abc import Sequence

from replay.questions.question import Question
from replay.questions.state_contract import state_question, stated
from replay.recording.cases import Case

PROMPT = (
    "Did the user ask you to do anything additional once the main work is done? State that "
    "instruction exactly, with every identifier it names."
)


def deferred_instruction_question(
    case: Case, turns: Sequence[tuple[int, str]] | None = None
) -> Question | str:
    """The question, or why it is omitted."""
    statement = stated(case, "deferred_instruction", turns)
    if isinstance(statement, str):
        return statement
    return state_question(
        case,
        "deferred_instruction",
        statement,
        prompt=PROMPT,
        reference=statement.template.render(statement.values),
    )
