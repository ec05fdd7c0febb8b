"""The token-count cache and the digests memo keep each message text once.

Every request parses its own copy of a session's history; the memos must keep one object per
text between them, and the digests memo must not keep texts the count cache has dropped.
"""

from __future__ import annotations

from policies.digests import Digests
from policies.shell_commands import exit_code
from policies.stages.outputs import describe, failed
from policies.tokens import TokenCounter

TEXT = "pytest output line\n" * 200  # 3,800 characters


def copy(text: str) -> str:
    """An equal text in another object, as the next request's parse gives."""
    duplicate = "".join(list(text))
    assert duplicate == text and duplicate is not text
    return duplicate


def tool(text: str) -> dict[str, str]:
    return {"role": "tool", "tool_call_id": "c1", "content": text}


def test_a_promoted_count_keeps_the_first_object() -> None:
    counter = TokenCounter(cache_max_chars=2 * len(TEXT) + 10)  # a generation holds one text
    first = copy(TEXT)
    counter.count_text(first)
    counter.count_text(copy("other " * 20))  # the young generation fills: `first` is old now
    counter.count_text(copy(TEXT))  # an old hit, promoted
    assert counter.shared_text(copy(TEXT)) is first


def test_digests_keep_the_counters_object_not_a_second_copy() -> None:
    counter = TokenCounter()
    digests = Digests(counter=counter)
    counted = copy(TEXT)
    counter.count_text(counted)
    later = copy(TEXT)  # the same message in a later request
    digest = digests.message(tool(later))
    (stored, stored_digest), *_ = digests._young.values()
    assert stored is counted and stored_digest == digest
    assert digests.message(tool(copy(TEXT))) == digest


def test_digests_drop_what_the_counter_dropped() -> None:
    counter = TokenCounter(cache_max_chars=2 * len(TEXT) + 10)
    digests = Digests(counter=counter)
    old = copy(TEXT)
    counter.count_text(old)
    digests.message(tool(old))
    for filler in ("a", "b", "c"):  # the counter starts two new generations: `old` is gone from it
        text = copy(filler * len(TEXT))
        counter.count_text(text)
        digests.message(tool(text))
    assert counter.shared_text(copy(TEXT)) is not old
    held = [text for generation in (digests._young, digests._old) for text, _ in generation.values()]
    assert all(text is not old for text in held)


def test_an_outputs_exit_code_is_read_once_for_every_stage_that_asks() -> None:
    """Whether an output failed, its description and the ledger all ask for its exit code at
    every compaction point: the text is scanned once."""
    text = "collected 3 items\n" + "x" * 5000 + "\nProcess exited with code 1"
    before = exit_code.cache_info()
    assert failed(text) is True
    assert "exit 1" in describe("execute_bash", "pytest", text)
    after = exit_code.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
