"""A faster exact counter for the packaged encodings, used only once it agrees with tiktoken.

``rs_bpe`` (MIT; Rust, built on GitHub's ``bpe`` crate, its OpenAI tables compiled in)
counts the same tokens as tiktoken's ``encode_ordinary`` two to three times faster, and
counts without building the token list. Counting each new tool output is a fixed part of
every agent step, so this is CPU the proxy spends on every request.

Its tables are its own copy, not the packaged rank files, so before it counts anything it
must agree with tiktoken (built from the packaged, checksum-verified ranks) on a probe set:
generated strings over the characters where BPE pre-tokenizers differ (whitespace runs,
contractions, digits, punctuation, accents, CJK, emoji, special-token text) plus realistic
agent text. Any disagreement, or the library missing, and tiktoken counts instead.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

try:
    from rs_bpe.bpe import openai as rs_bpe_openai  # type: ignore[import-not-found]
except ImportError:  # an optional speed-up: tiktoken counts without it
    rs_bpe_openai = None


class _Counts(Protocol):
    def count(self, text: str) -> int: ...


class _Encodes(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


# The encodings rs_bpe has, under tiktoken's names (its constructors are named alike).
_ENCODINGS = frozenset({"o200k_base", "cl100k_base"})

_PROBE_PIECES = [
    *"abcXYZ019 \t\n\r.,;:'\"!?()[]{}<>|/\\-_=+*&^%$#@~`",
    "é",
    "ß",
    "你",
    "好",
    "🙂",
    "👍🏽",
    "\u200b",
    "\u00a0",
    "ٱ",
    "ש",
    "ā",
    "\ufeff",
    "ǅ",
    "'s",
    "'ll",
    "'VE",
    "  ",
    "\n\n",
    "   \n",
    "12345",
    "3.14",
    "0x1F",
    "<|endoftext|>",
    "<|fim_prefix|>",
    "<|endofprompt|>",
    "\x00",
]

_PROBE_TEXTS = [
    "",
    "def count(self, text: str) -> int:\n    return len(self.encode(text))\n",
    '{"role": "tool", "content": "FAILED tests/test_x.py::test_a - AssertionError: 3 != 4"}',
    'Traceback (most recent call last):\n  File "/repo/a.py", line 12, in <module>\n',
    "    \n\n\t\t  mixed   whitespace\r\n  runs  \n",
    "ÀÉÎÕÜ àéîõü naïve café — \u201cquotes\u201d \u2018single\u2019 \u2026",
    "日本語のテキスト 한국어 текст العربية",
    "a" * 3000,
    " " * 513 + "x",
    "1234567890" * 40,
    "🙂🙃" * 100,
]


def probe_texts(seed: int = 20261204, count: int = 3000) -> list[str]:
    """The probe set: fixed texts and ``count`` generated ones (deterministic)."""
    rng = random.Random(seed)
    generated = ["".join(rng.choice(_PROBE_PIECES) for _ in range(rng.randint(1, 48))) for _ in range(count)]
    return [*_PROBE_TEXTS, *generated]


def agrees(candidate: _Counts, reference: _Encodes, texts: list[str]) -> bool:
    """Whether ``candidate`` counts every text as tiktoken's ``encode_ordinary`` does."""
    try:
        return all(candidate.count(t) == len(reference.encode_ordinary(t)) for t in texts)
    except Exception:  # a library that fails on a probe text is not used at all
        return False


def tiktoken_compatible(candidate: _Counts) -> Callable[[str], int]:
    """``candidate.count`` with tiktoken's rule for text that is not valid Unicode (a lone
    surrogate is replaced, as tiktoken does before encoding)."""
    count = candidate.count

    def counted(text: str) -> int:
        try:
            return count(text)
        except UnicodeEncodeError:
            return count(text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"))

    return counted


def fast_counter(
    name: str, reference: _Encodes, texts: list[str] | None = None
) -> Callable[[str], int] | None:
    """An exact counter for encoding ``name`` faster than ``reference``, or None when the
    library is missing, has no such encoding, or disagrees with ``reference`` on the probes."""
    if rs_bpe_openai is None or name not in _ENCODINGS:
        return None
    try:
        candidate: _Counts = getattr(rs_bpe_openai, name)()
    except Exception:
        return None
    return tiktoken_compatible(candidate) if agrees(candidate, reference, texts or probe_texts()) else None
