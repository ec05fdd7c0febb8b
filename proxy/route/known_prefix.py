"""What the proxy already knows about the start of a request: its session's last request.

An agent's next request repeats its last one and adds a step. Its body is parsed into new
objects, so memos keyed by identity (a request's token counts and message digests) start
empty, and each message of the known prefix would be looked up again by its text, several
Python calls per message and per pass. Instead, each message equal to the one at the same
position in the last request of the same conversation takes that message's count and
digest: comparing two parsed messages is one C-level equality, far cheaper than the lookups.

Only derived facts are carried over, never the objects: the view is built from the client's
own messages, so what goes upstream is always what this client sent. Equality is JSON value
equality as Python sees it (which also equates ``true`` with ``1``): a message whose only
difference were such a value would keep the earlier count and digest, which those values do
not change in practice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, count
from operator import is_not
from typing import Any

from policies.digests import Digests
from policies.tokens import TokenCounter


@dataclass(slots=True)
class KnownRequest:
    """One conversation's last request: its messages, their token counts in ``encoding``
    and the digests taken of them (None where none was)."""

    messages: list[Any]
    encoding: str
    tokens: tuple[int, ...]
    digests: tuple[str | None, ...]
    size: int  # tokens held, the budget's unit
    # The view sent and its counts: the session's own messages in it (a summary, placeholders,
    # a note) are the same objects in the next view, which then need no count.
    view: tuple[Any, ...] = ()
    view_tokens: tuple[int, ...] = ()


class KnownPrefixes:
    """The last request of each recent conversation, least recently used dropped first,
    bounded in conversations and in the tokens their messages hold."""

    def __init__(self, max_conversations: int = 10_000, max_tokens: int = 16 * 1024 * 1024) -> None:
        self.max_conversations = max_conversations
        self.max_tokens = max_tokens
        self._known: OrderedDict[str, KnownRequest] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._known)

    def adopt(
        self, key: str, messages: Sequence[Any], encoding: str, counter: TokenCounter, digests: Digests
    ) -> int:
        """Seed this request's ``counter`` and ``digests`` (both ``for_request``) with what is
        known of its messages' prefix; the number of messages adopted."""
        known = self._known.get(key)
        if known is None or known.encoding != encoding:
            return 0
        previous = known.messages
        limit = min(len(previous), len(messages))
        # Usually the very objects (``known_bodies.py`` reuses them): the first that is not
        # found by C iterators, then equal messages one by one.
        index = next(compress(count(), map(is_not, messages[:limit], previous[:limit])), limit)
        while index < limit and messages[index] == previous[index]:
            index += 1
        counter.remember_all(known.view, encoding, known.view_tokens)
        counter.remember_all(messages[:index], encoding, known.tokens[:index])
        counter.remember_prefix(messages, encoding, known.tokens[:index])
        digests.remember_all(messages[:index], known.digests[:index])
        return index

    def keep(
        self,
        key: str,
        messages: Sequence[Any],
        adopted: int,
        encoding: str,
        counter: TokenCounter,
        digests: Digests,
        view: Sequence[Any] | None = None,
    ) -> None:
        """Remember ``messages`` as the conversation's last request (counted by ``counter``:
        every count is a lookup in its memo by then), and the ``view`` sent for it. Its first
        ``adopted`` messages equal the ones already kept, and those stay: the objects kept are
        the first parse of each message, whose texts the count cache holds too, so keeping
        them adds no text copy."""
        tokens = counter.count_messages(messages, encoding)
        view_tokens = counter.count_messages(view, encoding) if view else ()
        size = sum(tokens) + sum(view_tokens)
        if size > self.max_tokens // 4:
            self.forget(key)  # one huge conversation must not push out all the others
            return
        found = digests.known(messages)
        previous = self._known.get(key)
        kept = list(messages)
        if previous is not None and adopted:
            kept[:adopted] = previous.messages[:adopted]
        known = KnownRequest(kept, encoding, tokens, found, size, tuple(view or ()), view_tokens)
        self.forget(key)
        self._known[key] = known
        self._tokens += size
        while self._known and (len(self._known) > self.max_conversations or self._tokens > self.max_tokens):
            _, dropped = self._known.popitem(last=False)
            self._tokens -= dropped.size

    def forget(self, key: str) -> None:
        dropped = self._known.pop(key, None)
        if dropped is not None:
            self._tokens -= dropped.size
