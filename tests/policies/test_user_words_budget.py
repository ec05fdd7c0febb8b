"""The user's words at tight budgets: identical repeats (harness nudges) shown once, in order;
a newer message never cut shorter than an older one; a cut one named by the handle of its whole
text; the same ledger rendered to the same bytes.

The checks read the rendered text only (whatever its marker says), so they hold the rendering,
not a helper, to the rules."""

from __future__ import annotations

import random
import re

import msgspec

from policies.handles import PATTERN
from policies.ledger import Ledger
from policies.ledger_records import RENDER_LEVELS, UserWords
from policies.ledger_user_words import render_user_words

HEADER = "### User instructions (verbatim, in order)"
TIGHTEST = RENDER_LEVELS[-1]
NUDGE = (
    "Please continue working on the task on whatever approach you think is suitable.\n"
    "If you think you have solved the task, please first send your answer to user through message "
    "and then finish the interaction.\nIMPORTANT: YOU SHOULD NEVER ASK FOR HUMAN HELP.\n"
)
# The injected case getmoto__moto-7365--inject-early-s5 (seed 5), at its 7th compaction.
STATEMENT = "For this change, the config key to set is `concurrency_limit` in `config/service.toml`."
CORRECTION = (
    "I was wrong earlier: the key in `config/service.toml` is `max_inflight_requests`, not "
    "`concurrency_limit`. Use `max_inflight_requests`."
)
MOTO = [
    STATEMENT,
    "You have my approval to remove `moto/dynamodb/models/_deprecated_io.py`; it is dead code.",
    CORRECTION,
    "Constraint for the rest of this task: do not modify any file under `tests/snapshots_260/`, and "
    "keep the public API of `moto/dynamodb/models/dynamo_type.py` unchanged.",
    "We decided to use `cattrs` instead of `hand-written converters` for the cache layer; stick with it.",
    "Before you finish, remember to reference `PLAT-9739` in a CHANGELOG entry for this fix.",
    NUDGE,
    NUDGE,
    NUDGE,
    NUDGE,
]
# A line of the section: its number, then either the text or a marker naming a handle and an opening.
LINE = re.compile(r"^\[(\d+)\] (\((?:long|cut)[^)]*handle=out_[0-9a-f]{16}[^)]*\) )?(.*)$")


def section(texts: list[str], budget: int = TIGHTEST.user_chars) -> str:
    ledger = Ledger(user_words=tuple(UserWords(t) for t in texts))
    rendered = ledger.render(msgspec.structs.replace(TIGHTEST, user_chars=budget))
    return rendered.split(HEADER, 1)[1].split("\n### ", 1)[0]


def shown(text: str) -> dict[int, tuple[bool, str]]:
    """Number -> (cut, what the line shows of the text) for single-line messages."""
    lines: dict[int, tuple[bool, str]] = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            opening = match.group(3)
            cut = match.group(2) is not None
            lines[int(match.group(1))] = (cut, opening.removesuffix("...") if cut else opening)
    return lines


def test_identical_repeats_are_shown_once_in_their_places() -> None:
    text = section(MOTO)
    assert text.count("Please continue working on the task") == 1
    # The text at its first position, each later copy a reference in its own place, in order.
    (seventh,) = [line for line in text.splitlines() if line.startswith("[7] ")]
    assert "(repeated as [8], [9], [10]) Please continue working" in seventh
    references = [line for line in text.splitlines() if "same as [7]" in line]
    assert references == ["[8] same as [7]", "[9] same as [7]", "[10] same as [7]"]


def test_the_correction_is_never_shown_less_than_the_statement_it_corrects() -> None:
    """The reported stale view: at the tightest level four nudges took the budget and the
    correction's opening stopped before its value while the statement's showed the old one."""
    text = section(MOTO)
    assert CORRECTION in text and STATEMENT in text
    last_fact = max(n for n, line in enumerate(text.splitlines()) if "max_inflight_requests" in line)
    last_stale = max(
        n
        for n, line in enumerate(text.splitlines())
        if "concurrency_limit" in line and "max_inflight_requests" not in line
    )
    assert last_fact > last_stale


def test_a_newer_message_too_long_for_what_is_left_is_not_cut_shorter_than_an_older_one() -> None:
    older = "Use the key `concurrency_limit`. " + "Some context about the change. " * 12
    newer = "Correction, after a long look at the code: " + "context " * 110 + "use `max_inflight_requests`."
    assert len(older) < TIGHTEST.user_chars < len(newer)
    lines = shown(section([older, newer]))
    (older_cut, older_shown), (newer_cut, newer_shown) = lines[1], lines[2]
    assert newer_cut and older_cut, "both cut: the older one may not stay whole while the newer is cut"
    assert len(newer_shown) >= len(older_shown)


def test_no_newer_message_is_cut_shorter_than_an_older_one_at_any_level() -> None:
    rng = random.Random(7)
    for _ in range(300):
        texts = [
            " ".join(f"w{rng.randrange(1000)}" for _ in range(rng.choice((3, 10, 30, 60, 150, 400))))
            for _ in range(rng.randrange(1, 12))
        ]
        budget = rng.choice([level.user_chars for level in RENDER_LEVELS])
        lines = shown(section(texts, budget))
        assert sorted(lines) == list(range(1, len(texts) + 1))
        for newer in range(1, len(texts) + 1):
            cut, newer_shown = lines[newer]
            if not cut:
                continue
            for older in range(1, newer):
                assert len(lines[older][1]) <= len(newer_shown), (budget, older, newer)


def test_a_cut_message_names_the_handle_of_its_whole_text_and_says_how_to_read_it() -> None:
    texts = ["x" * 900 + " first", "y" * 900 + " second", "short and whole"]
    ledger = Ledger(user_words=tuple(UserWords(t) for t in texts))
    text = section(texts)
    handles = PATTERN.findall(text)
    assert len(handles) == 2 and "read_tool_output" in text
    saved = ledger.saved_texts(TIGHTEST)
    assert [saved[h] for h in handles] == texts[:2]
    assert "[3] short and whole" in text


def test_the_same_ledger_renders_to_the_same_bytes() -> None:
    one = Ledger(user_words=tuple(UserWords(t) for t in MOTO))
    two = Ledger(user_words=tuple(UserWords(str(t)) for t in list(MOTO)))
    for limits in RENDER_LEVELS:
        assert one.render(limits) == two.render(limits) == one.render(limits)
    assert one.render_within(lambda t: len(t) < 1500) == two.render_within(lambda t: len(t) < 1500)


def test_a_repeated_message_is_as_new_as_its_last_copy() -> None:
    """The user says A, then B, then A again: A is in force, so B is the one cut first."""
    said_a = "Use `alpha` for the cache backend. " + "Reason: it is what production runs. " * 9
    said_b = "Use `beta` for the cache backend. " + "Reason: it is what staging runs. " * 9
    lines = shown(section([said_a, said_b, said_a]))
    assert lines[1] == (False, "(repeated as [3]) " + said_a) and lines[2][0], lines
    assert "same as [1]" in section([said_a, said_b, said_a]).splitlines()[-1]


def test_thousands_of_repeated_turns_render_in_one_pass() -> None:
    """20,000 user turns (a harness that repeats its nudge): each repeat names its first copy,
    and the first names every later one, computed once for the whole list (a rendering of
    each entry's repeats by its own pass over the list took minutes at this size)."""
    nudge = "Please continue working on the task."
    texts = [nudge if i % 2 else f"turn {i}" for i in range(20_000)]
    lines = render_user_words([UserWords(t) for t in texts])
    assert lines[-1] == "[20000] same as [2]"
    first = next(line for line in lines if line.startswith("[2] "))
    assert "(repeated as [4], [6]," in first and first.count("[") == 10_000
