"""``error``: the first exception line seen in a tool output or observation.

Only what a command or tool reported counts: an exception named in the task text, or in an
indented line (code, a docstring) of an output, was not raised.
"""

from __future__ import annotations

import re

from replay.questions.question import CONTENT, Question, evidence_line
from replay.questions.recording import INTERPRETER_SUFFIX, OBSERVATION_PREFIX, observations
from replay.recording.cases import Case

# An exception line: at the start of a line (pytest's "E   " allowed) or after one short label
# a script printed ("Error: ValueError: ..."); indented lines (docstrings, code) do not count.
_EXCEPTION_LINE = re.compile(
    r"^(?:E {2,}|[A-Za-z][\w ]{0,30}: )?((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): \S.*$"
)


def error_question(case: Case) -> Question | str:
    """The question, or why it is omitted."""
    for index, text in observations(case):
        text = OBSERVATION_PREFIX.sub("", text, count=1)
        for raw in text.splitlines():
            # Indentation kept: an indented line is code or a docstring, not a raised exception.
            line = INTERPRETER_SUFFIX.sub("", raw).rstrip()
            match = _EXCEPTION_LINE.match(line)
            if not match:
                continue
            if re.match(r"E {2,}", line):
                line = line[1:].strip()
            evidence = evidence_line(line)
            return Question(
                question_id=f"{case.case_id}:error",
                kind="error",
                prompt=(
                    "What was the first exception you saw in the output of a command or tool during this "
                    "work? Quote that exception line exactly (the form `SomeError: message`)."
                ),
                reference=evidence,
                evidence=(evidence,),
                exact_items=(match.group(1), evidence),
                source_messages=(index,),
                evidence_in=(CONTENT,),
            )
    return "no exception line in any tool output"
