"""Exact, offline, incremental token counting for chat requests.

Counts are tiktoken's (``encode_ordinary``) with rank files shipped inside this package (see
``policies.encodings``), so nothing is downloaded; a faster library counts instead once it has
counted a probe set exactly as tiktoken does (``policies.encodings.fast_bpe``).

The per-message framing follows OpenAI's published counting recipe for chat models: every
message costs ``TOKENS_PER_MESSAGE`` on top of its role and content, a ``name`` costs one
more, and the reply is primed with ``REPLY_PRIMING`` tokens. Tool schemas and tool calls are counted on
their compact JSON, which is how they reach the model's prompt, plus a small framing cost.

Counting 120k tokens from cold takes tens of milliseconds, while an agent's next request
only adds one step, so counts of individual strings are cached by their exact text: the
next request of a session pays only for its new messages.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from policies.encodings import SUPPORTED_ENCODINGS, CounterBackend, TextCounter, load_counter
from policies.text_counts import ObjectCounts, TextCountCache

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
TOKENS_PER_TOOL_CALL = 3
TOKENS_PER_TOOL_SCHEMA = 8
# An image part is billed by its size, which the proxy cannot see without decoding it; this
# is the documented cost of a low-detail image, used as a floor rather than a guess at size.
TOKENS_PER_IMAGE_PART = 85

DEFAULT_MODEL_ENCODINGS: dict[str, str] = {
    "gpt-4o*": "o200k_base",
    "gpt-4.1*": "o200k_base",
    "gpt-4.5*": "o200k_base",
    "gpt-5*": "o200k_base",
    "chatgpt-4o*": "o200k_base",
    "o1*": "o200k_base",
    "o3*": "o200k_base",
    "o4*": "o200k_base",
    "codex-mini*": "o200k_base",
    "gpt-4*": "cl100k_base",
    "gpt-3.5*": "cl100k_base",
    "text-embedding-3*": "cl100k_base",
    "text-embedding-ada-002": "cl100k_base",
}

# Texts longer than this are counted piece by piece: encoding a 50 MB text at once would build
# a list of tens of millions of tokens (gigabytes of Python integers) only to take its length.
_PIECE_CHARS = 1 << 20


def _count(count: Callable[[str], int], text: str) -> int:
    """Tokens of ``text``; past ``_PIECE_CHARS``, summed over pieces cut after a newline or a
    space (a cut can merge or split one token: at most one token per megabyte off)."""
    if len(text) <= _PIECE_CHARS:
        return count(text) if text else 0
    total = 0
    start = 0
    while start < len(text):
        end = min(len(text), start + _PIECE_CHARS)
        if end < len(text):
            cut = max(text.rfind("\n", start, end), text.rfind(" ", start, end))
            if cut > start:
                end = cut + 1
        total += count(text[start:end])
        start = end
    return total


def json_text(value: object) -> str:
    """Compact JSON of a value, as the model sees it; values only a lenient parser reads
    (integers past 64 bits, lone surrogates) are written the way Python's own JSON does."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"), default=repr, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class RequestTokens:
    """Token counts of one chat request: per message, tool schemas, and the total prompt."""

    messages: tuple[int, ...]
    tools: int
    total: int
    encoding: str


class TokenCounter:
    """Counts chat requests per model family; cheap on repeated content.

    ``model_encodings`` maps glob patterns of model names to encodings, first match wins;
    a model that matches none uses ``default_encoding``.
    """

    def __init__(
        self,
        default_encoding: str = "o200k_base",
        model_encodings: Mapping[str, str] | None = None,
        cache_max_chars: int = 64 * 1024 * 1024,
        backend: CounterBackend = "auto",
    ) -> None:
        mapping = dict(DEFAULT_MODEL_ENCODINGS if model_encodings is None else model_encodings)
        for encoding in (default_encoding, *mapping.values()):
            if encoding not in SUPPORTED_ENCODINGS:
                raise ValueError(
                    f"unsupported encoding {encoding!r}; supported: {', '.join(SUPPORTED_ENCODINGS)}"
                )
        self.default_encoding = default_encoding
        self._patterns = tuple(mapping.items())
        self._model_cache: dict[str, str] = {}
        self._backend: CounterBackend = backend
        self._encodings: dict[str, TextCounter] = {}
        self._caches: dict[str, TextCountCache] = {}
        self._cache_max_chars = cache_max_chars
        self._role_counts: dict[str, dict[str, int]] = {}
        # Shared by the counters of every request (``for_request`` copies the reference).
        self._tool_counts = ObjectCounts()
        # Only in a counter for one request (``for_request``): encoding -> message id -> tokens,
        # and every message so counted, held in ``_held`` so that its id cannot name another
        # object while the request lasts.
        self._messages: dict[str, dict[int, int]] | None = None
        self._held: list[object] = []
        # Only there too: list id -> (a copy of the list, encoding, its counts). The stages ask
        # for the counts of one list several times; a hit needs the list equal to the copy
        # (its messages the same objects, in C), so a list changed in place counts again.
        self._lists: dict[int, tuple[list[object], str, tuple[int, ...]]] | None = None
        # Only there too: (a list, its first messages, encoding, their counts) from
        # ``remember_prefix``.
        self._prefix: tuple[list[object], list[object], str, tuple[int, ...]] | None = None

    def for_request(self) -> TokenCounter:
        """This counter for one request: the same caches and encodings, and a memo of the
        messages it counted, by identity. A request counts the same message objects several
        times (the policy's stages, the read loop's rounds), and each count after the first is
        one lookup. Drop it with the request (its memo keeps those messages alive); a message
        must not change once counted (the stages build new messages, never edit one)."""
        # A plain attribute copy: ``copy.copy`` goes through ``__reduce_ex__``, several times
        # slower, and this runs on every request.
        scoped = object.__new__(type(self))
        scoped.__dict__.update(self.__dict__)
        scoped._messages = {}
        scoped._held = []
        scoped._lists = {}
        scoped._prefix = None
        return scoped

    def remember_prefix(self, messages: Sequence[object], encoding: str, counts: Sequence[int]) -> None:
        """In a counter from ``for_request``: ``counts`` are those of the first messages of
        ``messages`` (its conversation's known prefix), so counting that list counts only the
        rest, in one pass over the new messages instead of a lookup per message."""
        if self._lists is not None and isinstance(messages, list) and counts:
            self._prefix = (messages, messages[: len(counts)], encoding, tuple(counts))

    def remember_list(self, messages: Sequence[object], encoding: str, counts: tuple[int, ...]) -> None:
        """In a counter from ``for_request``: ``counts`` are those of ``messages``, one each (a
        view made of a counted request's messages and a few new ones), so counting that list
        again, or a copy of it, is a lookup."""
        if self._lists is not None and len(counts) == len(messages):
            self._lists[id(messages)] = (list(messages), encoding, counts)

    def _with_known_prefix(self, messages: list[object], encoding: str) -> tuple[int, ...] | None:
        prefix = self._prefix
        if prefix is None or prefix[0] is not messages or prefix[2] != encoding:
            return None
        known = prefix[3]
        if messages[: len(known)] != prefix[1]:  # the same objects (in C), unless changed in place
            return None
        return known + tuple(self.count_message(m, encoding) for m in messages[len(known) :])

    def remember(self, message: object, encoding: str, tokens: int) -> None:
        """Take ``tokens`` as the count of ``message`` in this request (a counter from
        ``for_request``): the caller knows it from an equal message counted before."""
        if self._messages is not None:
            self._messages.setdefault(encoding, {})[id(message)] = tokens
            self._held.append(message)

    def remember_all(self, messages: Sequence[object], encoding: str, counts: Sequence[int]) -> None:
        """``remember`` for each of ``messages`` with its count in ``counts`` (C loops, no
        object kept per message)."""
        if self._messages is not None:
            self._messages.setdefault(encoding, {}).update(zip(map(id, messages), counts, strict=True))
            self._held.extend(messages)

    def warm_up(self, encodings: Iterable[str] | None = None) -> None:
        """Load encodings now (about 0.3 s each) instead of on first use; by default the
        default encoding only, since each one costs memory (o200k about 50 MB)."""
        for name in encodings or (self.default_encoding,):
            self._encoding(name)

    def is_loaded(self, encoding: str) -> bool:
        return encoding in self._encodings

    def encoding_for(self, model: object) -> str:
        if not isinstance(model, str):
            return self.default_encoding
        found = self._model_cache.get(model)
        if found is None:
            found = next(
                (enc for pattern, enc in self._patterns if fnmatch.fnmatchcase(model, pattern)),
                self.default_encoding,
            )
            if len(self._model_cache) < 4096:
                self._model_cache[model] = found
        return found

    def _encoding(self, name: str) -> TextCounter:
        encoding = self._encodings.get(name)
        if encoding is None:
            encoding = load_counter(name, self._backend)
            self._encodings[name] = encoding
            self._caches[name] = TextCountCache(self._cache_max_chars)
        return encoding

    def backend(self, name: str | None = None) -> str:
        """What counts encoding ``name`` (the default one if not given): ``rs_bpe`` or ``tiktoken``."""
        return self._encoding(name or self.default_encoding).backend

    @property
    def cache_flips(self) -> int:
        """How many times a text cache has started a new generation (and dropped its oldest)."""
        return sum(cache.flips for cache in self._caches.values())

    def shared_text(self, text: str) -> str:
        """``text`` as the object a count cache already holds, else ``text`` itself: another
        memo of message texts (``Digests``) keeps that one, so a text is in memory once."""
        for cache in self._caches.values():
            found = cache.stored(text)
            if found is not None:
                return found
        return text

    def count_text(self, text: str, encoding: str | None = None) -> int:
        name = encoding or self.default_encoding
        cache = self._caches.get(name)
        if cache is None:
            self._encoding(name)
            cache = self._caches[name]
        count = cache.get(text)
        if count is None:
            count = _count(self._encodings[name].count, text)
            cache.put(text, count)
        return count

    def count_content(self, content: object, encoding: str) -> int:
        """Content as a string, a list of parts, or anything else JSON (counted as JSON)."""
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content, encoding)
        if isinstance(content, list):
            total = 0
            for part in content:
                if isinstance(part, dict):
                    kind = part.get("type")
                    text = part.get("text")
                    if isinstance(text, str):
                        total += self.count_text(text, encoding)
                    elif kind in ("image_url", "input_image", "image"):
                        total += TOKENS_PER_IMAGE_PART
                    else:
                        total += self.count_text(json_text(part), encoding)
                elif isinstance(part, str):
                    total += self.count_text(part, encoding)
            return total
        return self.count_text(json_text(content), encoding)

    def count_message(self, message: object, encoding: str) -> int:
        memo = self._messages
        if memo is None:
            return self._count_message(message, encoding)
        counted = memo.get(encoding)
        if counted is None:
            counted = memo[encoding] = {}
        found = counted.get(id(message))
        if found is not None:
            return found
        total = self._count_message(message, encoding)
        counted[id(message)] = total
        self._held.append(message)
        return total

    def _count_message(self, message: object, encoding: str) -> int:
        if not isinstance(message, dict):
            return TOKENS_PER_MESSAGE
        total = TOKENS_PER_MESSAGE
        role = message.get("role")
        if isinstance(role, str):
            roles = self._role_counts.setdefault(encoding, {})
            role_count = roles.get(role)
            if role_count is None:
                role_count = self.count_text(role, encoding)
                if len(roles) < 64:
                    roles[role] = role_count
            total += role_count
        total += self.count_content(message.get("content"), encoding)
        name = message.get("name")
        if isinstance(name, str) and name:
            total += TOKENS_PER_NAME + self.count_text(name, encoding)
        tool_calls = message.get("tool_calls")
        if isinstance(tool_calls, list):
            for call in tool_calls:
                total += TOKENS_PER_TOOL_CALL
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    fn_name = function.get("name")
                    if isinstance(fn_name, str):
                        total += self.count_text(fn_name, encoding)
                    arguments = function.get("arguments")
                    if isinstance(arguments, str):
                        total += self.count_text(arguments, encoding)
                    elif arguments is not None:
                        total += self.count_content(arguments, encoding)
        function_call = message.get("function_call")
        if isinstance(function_call, dict):
            total += self.count_content(function_call, encoding)
        wire_only = message.get("wire_only")  # policies.conversation.WIRE_ONLY
        if isinstance(wire_only, str) and wire_only:
            total += self.count_text(wire_only, encoding)
        wire_tokens = message.get("wire_tokens")  # policies.conversation.WIRE_TOKENS
        if isinstance(wire_tokens, int) and not isinstance(wire_tokens, bool) and wire_tokens > 0:
            total += wire_tokens
        return total

    def count_tools(self, tools: object, encoding: str) -> int:
        """Each tool schema object is encoded and counted once: a request counts its schemas in
        the policy and again in every read round, and the next request of a conversation
        brings the same objects (its body's closing fields are reused when their bytes are
        unchanged); an agent's 24 tools are 80 KB of JSON to encode each time."""
        if not isinstance(tools, list) or not tools:
            return 0
        memo = self._tool_counts
        total = 0
        for tool in tools:
            tokens = memo.get(encoding, tool)
            if tokens is None:
                tokens = TOKENS_PER_TOOL_SCHEMA + self.count_text(json_text(tool), encoding)
                memo.put(encoding, tool, tokens)
            total += tokens
        return total

    def count_messages(self, messages: Sequence[object], encoding: str) -> tuple[int, ...]:
        lists = self._lists
        if lists is None or not isinstance(messages, list):
            return tuple(self.count_message(m, encoding) for m in messages)
        found = lists.get(id(messages))
        if found is not None and found[1] == encoding and found[0] == messages:
            return found[2]
        # Another list of the same messages (a body rendered from the view): equal to a
        # counted one, element by element, mostly by identity.
        for saved, saved_encoding, saved_counts in lists.values():
            if saved_encoding == encoding and len(saved) == len(messages) and saved == messages:
                return saved_counts
        counts = self._with_known_prefix(messages, encoding) or tuple(
            self.count_message(m, encoding) for m in messages
        )
        lists[id(messages)] = (list(messages), encoding, counts)
        return counts

    def count_request(self, body: Mapping[str, Any]) -> RequestTokens:
        """Prompt tokens of a chat request: messages, tool schemas and the reply priming."""
        encoding = self.encoding_for(body.get("model"))
        messages = body.get("messages")
        per_message = self.count_messages(messages, encoding) if isinstance(messages, list) else ()
        tools = self.count_tools(body.get("tools"), encoding) + self.count_tools(
            body.get("functions"), encoding
        )
        return RequestTokens(
            messages=per_message,
            tools=tools,
            total=sum(per_message) + tools + REPLY_PRIMING,
            encoding=encoding,
        )
