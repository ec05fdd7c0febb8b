"""The faster counter counts exactly as tiktoken does, or is not used."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.encodings import load_counter, load_encoding
from policies.encodings.fast_bpe import agrees, fast_counter, probe_texts, tiktoken_compatible
from policies.tokens import TokenCounter

ENCODINGS = ("o200k_base", "cl100k_base")

# Text the way agents send it: code, whitespace runs, any Unicode (lone surrogates included).
agent_text = st.lists(
    st.one_of(
        st.sampled_from(list(" \t\n\r.,;:'\"()[]{}<>=_-+*/\\#`~|0123456789")),
        st.characters(),
        st.sampled_from(["'s", "'ll", "    ", "\n\n", "<|endoftext|>", "🙂", "你好", "é"]),
    ),
    max_size=60,
).map("".join)


@pytest.mark.parametrize("name", ENCODINGS)
def test_the_auto_counter_is_the_fast_one_and_agrees_on_the_probe_set(name: str) -> None:
    counter = load_counter(name)
    assert counter.backend == "rs_bpe"  # the library is a dependency: a silent fallback is a bug
    reference = load_encoding(name)
    for text in probe_texts(seed=7, count=500):
        assert counter.count(text) == len(reference.encode_ordinary(text)), repr(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=agent_text)
def test_any_text_counts_as_tiktoken_counts_it(text: str) -> None:
    for name in ENCODINGS:
        assert load_counter(name).count(text) == len(load_encoding(name).encode_ordinary(text))


def test_lone_surrogates_count_as_tiktoken_counts_them() -> None:
    for text in ("\ud800", "a\udfffb", "ok \ud83d then"):
        for name in ENCODINGS:
            assert load_counter(name).count(text) == len(load_encoding(name).encode_ordinary(text))


def test_a_library_that_disagrees_on_one_probe_is_not_used() -> None:
    reference = load_encoding("o200k_base")

    class OffByOneOnDigits:
        def count(self, text: str) -> int:
            return len(reference.encode_ordinary(text)) + ("7" in text)

    assert not agrees(OffByOneOnDigits(), reference, probe_texts())

    class Same:
        def count(self, text: str) -> int:
            return len(reference.encode_ordinary(text))

    assert agrees(Same(), reference, probe_texts())


def test_a_library_that_raises_is_not_used() -> None:
    class Broken:
        def count(self, text: str) -> int:
            raise RuntimeError("no tables")

    assert not agrees(Broken(), load_encoding("o200k_base"), ["x"])


def test_an_encoding_the_library_lacks_is_counted_by_tiktoken() -> None:
    assert fast_counter("p50k_base", load_encoding("o200k_base")) is None


def test_the_surrogate_rule_is_applied_before_counting() -> None:
    seen: list[str] = []

    class Strict:
        def count(self, text: str) -> int:
            text.encode("utf-8")
            seen.append(text)
            return len(text)

    assert tiktoken_compatible(Strict())("a\ud800b") == 3
    assert seen == ["a\ufffdb"]


def test_tiktoken_can_be_chosen() -> None:
    counter = TokenCounter(backend="tiktoken")
    assert counter.backend() == "tiktoken"
    assert counter.count_text("hello world") == TokenCounter().count_text("hello world") == 2
