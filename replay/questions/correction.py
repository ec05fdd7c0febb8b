"""``correction``: a value the user corrected ("the config key is `A`, not `B` as I said
before"), stated in a user turn after the task.

The evidence is the corrected value; the superseded one is the question's ``stale`` item: a
view that still holds the earlier wrong statement but not the correction presents the stale
value as current (``stale_presented``).
"""

from __future__ import annotations

from collections.abc import Sequence

from replay.questions.question import Question
from replay.questions.state_contract import state_question, stated
from replay.recording.cases import Case

PROMPT = (
    "The user corrected something they had told you earlier. What is the value that applies "
    "now, and which earlier value does it replace? Give both exactly."
)


def correction_question(case: Case, turns: Sequence[tuple[int, str]] | None = None) -> Question | str:
    """The question, or why it is omitted."""
    statement = stated(case, "correction", turns)
    if isinstance(statement, str):
        return statement
    corrected, superseded = statement.fact, statement.values["stale"]
    return state_question(
        case,
        "correction",
        statement,
        prompt=PROMPT,
        reference=f"`{corrected}` (it replaces `{superseded}`, which was wrong)",
        stale=[superseded],
    )
