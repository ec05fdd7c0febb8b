"""The parts of one streamed round while it may still turn out to be a read round, shared by
the Responses API's and Anthropic's streams (output items there, content blocks here).

A round that calls ``read_tool_output`` is asked again, and the client must never see it: not
its reasoning or thinking, not a short preamble ("Checking a saved output first."), not its
read calls. So, as parts start:

- reasoning (or thinking) waits for the part after it, whose fate it shares;
- the round's first text is held, with the reasoning before it, until it writes more than
  ``HELD_TEXT_CHARS`` characters (then it is relayed, and its text from then on as it
  arrives) or the round ends;
- a read call marks the held text and the waiting reasoning as the read round's: they go back
  upstream with the read, never to the client;
- any other part (an agent's call, a server tool block) is held to the round's end. With
  ``keep_order`` (Messages), so is every later part, so the client gets the round's blocks in
  the order the model wrote them, and the thinking before it stays with the round's fate;
  without (Responses: items are numbered as they reach the client), the reasoning before it is
  flushed with it in the model's order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from proxy.dialects.base import HELD_TEXT_CHARS


class Part(Protocol):
    read: bool  # the part belongs to a read round: it never reaches the client


P = TypeVar("P", bound=Part)


class HeldParts(Generic[P]):
    def __init__(self, flush: Callable[[P], Awaitable[None]], *, keep_order: bool) -> None:
        """``flush(part)``: relay a part's held events to the client (and from then on, its
        events as they come)."""
        self._flush = flush
        self._keep_order = keep_order
        self._waiting: list[P] = []  # reasoning waiting for the part after it
        self._text: P | None = None  # the held text
        self._before_text: list[P] = []  # the reasoning that came before the held text
        self._chars = 0
        self._holding = False  # keep_order: a part is held to the round's end, so is every later one

    def reasoning_started(self, part: P) -> None:
        self._waiting.append(part)

    def read_started(self) -> None:
        """The round reads: its held text and waiting reasoning go back upstream with the read."""
        if self._text is not None:
            self._text.read = True
            self._waiting = [*self._before_text, *self._waiting]
            self._text, self._before_text = None, []
        for part in self._waiting:
            part.read = True
        self._waiting = []

    def text_started(self, part: P) -> bool:
        """True: the text is held, with the reasoning before it, until the round shows it is not
        a read round. False: it is held like any other part (there is held text already)."""
        if self._text is not None or self._holding:
            self.other_started()
            return False
        self._text, self._before_text, self._waiting = part, self._waiting, []
        self._chars = 0
        return True

    def other_started(self) -> None:
        if self._keep_order:
            self._holding = True
        else:
            self._waiting = []

    async def text_added(self, part: P, chars: int) -> None:
        """The held text wrote ``chars`` more: past a read round's preamble, it is relayed."""
        if part is not self._text:
            return
        self._chars += chars
        if self._chars > HELD_TEXT_CHARS:
            text, before = self._text, self._before_text
            self._text, self._before_text = None, []
            for reasoning in before:
                await self._flush(reasoning)
            await self._flush(text)
