"""The checks a prepared summary passes before it stands for a compaction point's: it covers a
prefix of the point's range unedited, carries forward the narrative the point's summary has
now, names no handle or file the ledger does not know, spells every identifier it shares with
the ledger as the ledger does, and fits the output budget.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from policies.ledger import Ledger
from policies.stages.summary_state import narrative
from policies.summarizer import SummaryRequest, SummaryResult

_HANDLE = re.compile(r"\bout_[0-9a-f]{16}\b")
# A path-like word: a file name with an extension, possibly under directories.
_FILE = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|js|ts|tsx|go|rs|java|rb|c|h|cc|cpp|md|txt|json|yml|yaml|toml|cfg|ini|sh))\b"
)
# An exact identifier: a word with an underscore, a dot inside, or a lower-to-upper change
# (snake_case, module.attr, camelCase); plain words may be capitalized at will.
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


def _identifiers(text: str) -> list[str]:
    return [w for w in _WORD.findall(text) if "_" in w or "." in w or re.search(r"[a-z][A-Z]", w)]


@dataclass(frozen=True, slots=True)
class Prepared:
    start: int
    digests: tuple[str, ...]
    result: SummaryResult
    made: float
    # The digest of the credential that paid (``SummaryCredential.payer``), never the key.
    payer: str = "unknown"
    # The narrative it was written on (``lineage`` of its request's previous summary).
    built_on: str = ""


def lineage(previous_summary: str | None) -> str:
    """Which model narrative a summary request carries forward (its previous summary's, a
    ledger-only summary keeping the one before it): a digest, "" for none."""
    told = narrative(previous_summary) if previous_summary else ""
    return hashlib.blake2b(told.encode(), digest_size=12).hexdigest() if told else ""


def known_names(ledger: Ledger) -> tuple[set[str], set[str], dict[str, str]]:
    """The handles, files and identifiers the ledger knows (identifiers by lower case)."""
    text = " ".join(
        [
            ledger.goal,
            *(f.path for f in ledger.files),
            *(c.command for c in ledger.commands),
            *ledger.errors,
            *ledger.open_items,
        ]
    )
    files = {f.path for f in ledger.files} | {m.group(1) for m in _FILE.finditer(text)}
    words = {w.lower(): w for w in _identifiers(text)}
    return set(ledger.handles), files, words


def check(
    prepared: Prepared, request: SummaryRequest, max_tokens: int, count: Callable[[str], int]
) -> str | None:
    """Why ``prepared`` may not stand for ``request``'s summary, or None when it may."""
    start, _ = request.covered
    covered = request.covered_digests
    if prepared.start != start or prepared.digests != covered[: len(prepared.digests)]:
        return "stale"
    if len(prepared.digests) > len(covered):
        return "stale"
    # Written before the point's current summary (another process's preparation of an earlier
    # point's range, landing late): it would put an older narrative in the newer one's place.
    if prepared.built_on != lineage(request.previous_summary):
        return "stale"
    text = prepared.result.text
    handles, files, words = known_names(request.ledger)
    unknown_handle = next((h for h in _HANDLE.findall(text) if h not in handles), None)
    if unknown_handle is not None:
        return f"rejected: names handle {unknown_handle}, which the ledger does not know"
    unknown_file = next(
        (f for f in (m.group(1) for m in _FILE.finditer(text)) if not _known_file(f, files)), None
    )
    if unknown_file is not None:
        return f"rejected: names file {unknown_file}, which the ledger does not know"
    for word in _identifiers(text):
        spelled = words.get(word.lower())
        if spelled is not None and spelled != word:
            return f"rejected: spells {spelled} as {word}"
    if count(text) > max_tokens:
        return "rejected: over the summary budget"
    return None


def decoded(raw: bytes) -> Prepared | None:
    try:
        data = orjson.loads(raw)
        result = SummaryResult(**data["result"])
        # One stored before payers were recorded matches no request ("unknown").
        payer = str(data.get("payer") or "unknown")
        # One stored before narratives were recorded is stale at any point (one miss).
        built_on = str(data.get("built_on", "unknown"))
        return Prepared(
            int(data["start"]), tuple(data["digests"]), result, float(data["made"]), payer, built_on
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _known_file(name: str, files: set[str]) -> bool:
    return name in files or any(f.endswith("/" + name) or name.endswith("/" + f) for f in files)
