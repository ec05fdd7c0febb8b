"""Questions with programmatic reference answers.

Every reference is copied from the recorded run or its final patch; no model writes one. A
question lists the *evidence* its answer depends on: verbatim substrings of the history (of a
message's content, or of a native tool call's parsed argument values) that an answerer must
see. The harness checks each one against a compacted view: visible, recoverable from an
offloaded output, or lost.

Four kinds, one module each:

- ``files_changed``: the repository-relative paths the final patch changes.
- ``first_edit``: the code of the first edit applied inside the task repository (a failed
  edit, or one outside the repository, does not count; if the first one was made by a shell
  command, the question is omitted rather than replaced by a later edit).
- ``command_output``: what the Nth execution of a command reported (a test summary, else the
  last output line of a ``python <script>`` run). Input sent to a running process is not an
  execution.
- ``error``: the first exception line seen in a tool output or observation.

Five state-contract kinds (what the user set, which a compaction must keep), asked only when a
user turn after the task states one in a recognised form (the injection suite inserts such
turns; real runs rarely have them):

- ``constraint``, ``correction``, ``deferred_instruction``, ``approval``, ``decision``: the
  exact fact of the statement (``state_contract``); a correction also names the value it
  superseded, which must not be presented as current.

``question`` holds the record they build, ``recording`` the readers of the recorded run they
share, ``drift`` the compaction cycles that passed over a question's evidence. Pure and
deterministic: no I/O. ``KINDS`` are asked by default; ``ALL_KINDS`` can be asked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from replay.questions.approval import approval_question
from replay.questions.command_output import command_output_question
from replay.questions.constraint import constraint_question
from replay.questions.correction import correction_question
from replay.questions.decision import decision_question
from replay.questions.deferred_instruction import deferred_instruction_question
from replay.questions.drift import (
    CYCLE_BUCKETS,
    cycles_bucket,
    cycles_over,
    drift_table,
    failing_examples,
    lost_snippet,
    question_cycles,
)
from replay.questions.error import error_question
from replay.questions.files_changed import files_changed_question, patch_paths
from replay.questions.first_edit import first_edit_question
from replay.questions.question import ALL_KINDS, ARGUMENTS, CONTENT, KINDS, STATE_KINDS, Question
from replay.questions.recording import history_texts, recorded_actions, repo_root, strings_in
from replay.questions.state_contract import instruction_turns, stale_presented
from replay.recording.cases import Case

__all__ = [
    "ALL_KINDS",
    "ARGUMENTS",
    "CONTENT",
    "CYCLE_BUCKETS",
    "KINDS",
    "STATE_KINDS",
    "Question",
    "build_questions",
    "cycles_bucket",
    "cycles_over",
    "drift_table",
    "failing_examples",
    "history_texts",
    "lost_snippet",
    "patch_paths",
    "question_cycles",
    "repo_root",
    "stale_presented",
    "strings_in",
]

# Each builds its kind from the user's turns after the task (computed once per case).
STATE_BUILDERS: dict[str, Callable[[Case, Sequence[tuple[int, str]] | None], Question | str]] = {
    "constraint": constraint_question,
    "correction": correction_question,
    "deferred_instruction": deferred_instruction_question,
    "approval": approval_question,
    "decision": decision_question,
}


def build_questions(case: Case, kinds: Sequence[str] = KINDS) -> tuple[list[Question], dict[str, str]]:
    """Questions for one case, and for each kind omitted the reason (for the report)."""
    unknown = [kind for kind in kinds if kind not in ALL_KINDS]
    if unknown:
        raise ValueError(f"unknown question kinds: {unknown}")
    texts = history_texts(case)
    actions = recorded_actions(case)
    questions: list[Question] = []
    omitted: dict[str, str] = {}
    # Built first whatever the order: command_output avoids quoting the error question's line.
    error = error_question(case)
    error_line = None if isinstance(error, str) else error.reference
    for kind in KINDS:
        if kind not in kinds:
            continue
        built: Question | str
        if kind == "files_changed":
            built = files_changed_question(case, texts)
        elif kind == "first_edit":
            built = first_edit_question(case, actions, texts)
        elif kind == "command_output":
            built = command_output_question(case, actions, texts, error_line)
        else:
            built = error
        if isinstance(built, str):
            omitted[kind] = built
        else:
            questions.append(built)
    if any(kind in STATE_KINDS for kind in kinds):
        turns = instruction_turns(case)
        for kind in STATE_KINDS:
            if kind in kinds:
                state = STATE_BUILDERS[kind](case, turns)
                if isinstance(state, str):
                    omitted[kind] = state
                else:
                    questions.append(state)
    return questions, omitted
