"""``read_tool_output`` with handle ``*``: one pattern searched in every saved output of the
conversation at once.

A model rarely knows which of forty handles holds the line it needs (the first edit of a file,
what a test run printed); reading them one by one costs a round each and fills the window with
pages it did not want. The search runs the read's pattern (RE2, linear time) over the session's
saved outputs (the newest ``MAX_SEARCHED``) and answers with the matching lines under their
handles, held to the room the round has and to the read's byte limit.

Rules, when the matches do not all fit (the wanted line is often in an OLD output, and the
newest outputs are full of lines that match one word of the pattern):

- the best matches come first (``ranking.py``): lines matching more of the pattern's terms
  (its top-level alternatives), then the newest outputs, then the line's place;
- a line repeated word for word in several outputs is shown once (the best-ranked);
- every match is shown with two lines of context only when all of them fit so; else the
  matching lines alone, best first, as many as fit;
- the answer says how many matches it left out, in which outputs, and how to see them: a more
  specific pattern, or one output at a time with the same pattern (exact arguments given).
"""

from __future__ import annotations

import asyncio
import time

import orjson

from policies.tokens import TokenCounter
from proxy.read_tool.ranking import Hit, compile_terms, ordered, pattern_terms, scan_output
from proxy.read_tool.tool import MAX_MATCHES, ReadArguments, ReadLimits, ReadResult, compile_pattern
from proxy.state.store import Store

# Saved outputs one search covers: the newest of the session.
MAX_SEARCHED = 200
# A matching line shown without context is clipped at this many characters.
_LINE_CHARS = 400
# Tokens kept for the notes after the lines.
_NOTES_TOKENS = 120
# Outputs named, with their left-out counts, in the note that says how to see the rest.
_NAMED = 8


async def search_saved_outputs(
    store: Store,
    tenant: str,
    args: ReadArguments,
    handles: tuple[str, ...],
    *,
    limits: ReadLimits,
    timeout_seconds: float,
    room: int,
    counter: TokenCounter,
    encoding: str,
) -> ReadResult:
    """The best matching lines of the saved outputs in ``handles`` (newest last), within ``room``."""
    distinct = list(dict.fromkeys(reversed(handles)))
    newest = distinct[:MAX_SEARCHED]
    if not newest:
        return ReadResult("Error: this conversation has no saved outputs to search.", "not_found")
    assert args.pattern is not None
    regex = compile_pattern(args.pattern)
    terms = pattern_terms(args.pattern)
    compiled = compile_terms(terms)
    deadline = time.monotonic() + timeout_seconds
    found = Found(args.pattern, len(terms))
    # A session with thousands of saved outputs: the search's work stays bounded (the newest
    # MAX_SEARCHED, one store read each), and the answer says how many older ones it left.
    found.older = len(distinct) - len(newest)
    for age, handle in enumerate(newest):
        if time.monotonic() > deadline:
            found.unsearched += newest[age:]
            break
        try:
            stored = await store.get_output(tenant, handle)
        except Exception:  # the store is down: said in the answer, the rest goes on
            found.unsearched.append(handle)
            continue
        if stored is None or stored.content is None:
            continue
        try:
            hits, matching, lines = await asyncio.wait_for(
                asyncio.to_thread(
                    scan_output,
                    handle,
                    age,
                    stored.content,
                    regex,
                    compiled,
                    keep=MAX_MATCHES,
                    line_chars=_LINE_CHARS,
                ),
                timeout=max(0.01, deadline - time.monotonic()),
            )
        except TimeoutError:  # what was found so far is answered; the rest is named
            found.unsearched += newest[age:]
            break
        found.add(handle, hits, matching, lines)
    return await asyncio.to_thread(
        render_search,
        found,
        room=min(room, limits.max_result_tokens),
        max_bytes=limits.max_result_bytes,
        counter=counter,
        encoding=encoding,
    )


class Found:
    """What a search found: the kept hits of every output, and its counts."""

    def __init__(self, pattern: str, terms: int) -> None:
        self.pattern = pattern
        self.terms = terms
        self.searched = 0
        self.hits: list[Hit] = []
        self.matching: dict[str, int] = {}  # matching lines per output with any
        self.lines: dict[str, int] = {}  # lines per output searched
        self.unsearched: list[str] = []
        self.older = 0  # saved outputs older than the newest MAX_SEARCHED: never searched

    def add(self, handle: str, hits: list[Hit], matching: int, lines: int) -> None:
        self.searched += 1
        self.lines[handle] = lines
        if matching:
            self.matching[handle] = matching
            self.hits += hits

    def header(self) -> str:
        total = sum(self.matching.values())
        text = (
            f"Searched {self.searched} saved output(s) for the pattern: "
            f"{total} matching line(s) in {len(self.matching)}."
        )
        if total and self.terms > 1:
            text += (
                f" Best first: lines matching more of the pattern's {self.terms} alternatives, "
                "then the newest outputs."
            )
        elif total:
            text += " Newest outputs first."
        return text

    def section(self, handle: str) -> str:
        return f"handle={handle}: {self.matching[handle]} matching line(s) of {self.lines[handle]}"

    def numbered(self, handle: str, index: int, text: str) -> str:
        return f"{index + 1:>{len(str(self.lines[handle]))}}| {text}"


def _unique(ranked: list[Hit]) -> list[Hit]:
    """The hits without the lines repeated word for word in a better-ranked hit."""
    seen: set[str] = set()
    unique = []
    for hit in ranked:
        if hit.text not in seen:
            seen.add(hit.text)
            unique.append(hit)
    return unique


def _compose(found: Found, shown: list[Hit], *, context: bool) -> str:
    """The answer: the header, the hits under their handles (runs of one output, best first),
    and the notes: repeated lines, matches left out and how to see them, outputs not searched."""
    parts = [found.header()]
    runs: list[list[Hit]] = []
    for hit in shown:
        if runs and runs[-1][0].handle == hit.handle:
            runs[-1].append(hit)
        else:
            runs.append([hit])
    for run in runs:
        handle = run[0].handle
        if context:
            lines = sorted({pair for hit in run for pair in hit.context})
        else:
            lines = [(hit.line, hit.text) for hit in run]
        parts += [found.section(handle), *(found.numbered(handle, i, text) for i, text in lines)]
    texts = {hit.text for hit in shown}
    covered: dict[str, int] = {}
    for hit in found.hits:
        if hit.text in texts:
            covered[hit.handle] = covered.get(hit.handle, 0) + 1
    repeated = sum(covered.values()) - len(shown)
    left = {h: n - covered.get(h, 0) for h, n in found.matching.items() if n > covered.get(h, 0)}
    if repeated:
        parts.append(f"[{repeated} matching line(s) identical to a line shown are not repeated.]")
    if not context and shown:
        parts.append("[Matching lines only, without context, to fit the context window.]")
    if left:
        named = ", ".join(f"handle={h} ({n})" for h, n in list(left.items())[:_NAMED])
        more = f" and {len(left) - _NAMED} more output(s)" if len(left) > _NAMED else ""
        example = orjson.dumps({"handle": next(iter(left)), "pattern": found.pattern}).decode()
        parts.append(
            f"[{sum(left.values())} matching line(s) left out for room, in: {named}{more}. To see them, "
            "search with a more specific pattern (lines matching more of its alternatives come "
            f"first), or read one output at a time with the same pattern, e.g. {example}.]"
        )
    if found.unsearched:
        named = ", ".join("handle=" + h for h in found.unsearched[:20])
        more = f" and {len(found.unsearched) - 20} more" if len(found.unsearched) > 20 else ""
        parts.append(
            f"[Not searched (no time left, or the store could not be read): {named}{more}; "
            "search them by handle with the same pattern.]"
        )
    if found.older:
        parts.append(
            f"[{found.older} older saved output(s) not searched: a search covers the newest "
            f"{MAX_SEARCHED}. Search an older one by its handle with the same pattern (the "
            "summary's ledger and transcripts name them).]"
        )
    return "\n".join(parts)


def render_search(
    found: Found, *, room: int, max_bytes: int, counter: TokenCounter, encoding: str
) -> ReadResult:
    """``found`` within ``room`` tokens and ``max_bytes`` bytes, best first (pure; CPU-bound:
    callers run it in a worker thread)."""
    ranked = _unique(ordered(found.hits))
    every = len(found.hits) == sum(found.matching.values())  # no match past the ones kept
    text = ""
    if every and sum(len(t) for h in ranked for _, t in h.context) <= min(max_bytes, 6 * room):
        text = _compose(found, ranked, context=True)
        if _fits(text, room, max_bytes, counter, encoding):
            return ReadResult(text, "truncated" if found.unsearched or found.older else "ok", len(ranked))
    shown = _select(found, ranked, room, max_bytes, counter, encoding)
    text = _compose(found, shown, context=False)
    while shown and not _fits(text, room, max_bytes, counter, encoding):
        shown.pop()
        text = _compose(found, shown, context=False)
    whole = len(shown) == len(ranked) and every
    return ReadResult(
        text, "ok" if whole and not (found.unsearched or found.older) else "truncated", len(shown)
    )


def _fits(text: str, room: int, max_bytes: int, counter: TokenCounter, encoding: str) -> bool:
    return len(text.encode("utf-8", "replace")) <= max_bytes and counter.count_text(text, encoding) <= room


def _select(
    found: Found, ranked: list[Hit], room: int, max_bytes: int, counter: TokenCounter, encoding: str
) -> list[Hit]:
    """The best hits whose lines (and section headers) fit, taken in order: the first that does
    not fit ends it, so nothing worse is shown in place of something better."""
    header = found.header()
    tokens = room - _NOTES_TOKENS - counter.count_text(header, encoding)
    size = max_bytes - 2048 - len(header)
    shown: list[Hit] = []
    for hit in ranked:
        line = found.numbered(hit.handle, hit.line, hit.text)
        if not shown or shown[-1].handle != hit.handle:
            line = found.section(hit.handle) + "\n" + line
        cost, length = counter.count_text(line, encoding) + 1, len(line.encode("utf-8", "replace")) + 1
        if cost > tokens or length > size:
            break
        tokens, size = tokens - cost, size - length
        shown.append(hit)
    return shown
