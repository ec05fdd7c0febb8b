"""The report's "stored vs read back" table: what the store holds for each question kind, what
the scripted reader got back through the proxy, and what reading cost."""

from __future__ import annotations

from typing import Any

READS_NOTE = (
    "Stored: the evidence is visible, or held by the store under a handle the view names (or one "
    "a saved text names, up to three hops). Read back: visible, or returned by a read through the "
    "proxy. Calls and rounds: per question that read; no room: reads the proxy answered without "
    "content for lack of room."
)


def reads_table(results: dict[str, Any]) -> list[list[str]]:
    """Per arm and kind: stored vs read back, and what the reads cost."""
    rows = [
        ["arm", "kind", "stored", "read back", "read calls / question", "read rounds / question", "no room"]
    ]
    for arm, figures in results["arms"].items():
        for kind, reads in sorted((figures.get("reads") or {}).items()):
            if not reads.get("questions"):
                continue
            total = reads["questions"]
            rows.append(
                [
                    arm,
                    kind,
                    f"{reads['stored']}/{total}",
                    f"{reads['read_back']}/{total}",
                    str(reads["read_calls_per_question"]),
                    str(reads["read_rounds_per_question"]),
                    str(reads["no_room_reads"]),
                ]
            )
    return rows if len(rows) > 1 else []
