"""Verify guidance, so a model reads exact evidence instead of quoting a summary.

Once the view refers to saved outputs, a short system note tells the model that exact
evidence is available and should be read before it is quoted.
Added once, at a compaction point, then kept byte for byte by the checkpoint."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import msgspec

from policies.view import Context, View

GUIDANCE = (
    "Some earlier tool outputs (and the bodies of large edits you made) were saved outside the "
    "conversation and replaced by placeholders that name a handle (handle=out_...); the summary "
    "lists the others, your edits by file. When you need exact "
    "evidence from them (code, counts, error text, paths), call read_tool_output with the handle "
    "and read it before you quote it; do not guess it from the summary."
)


class VerifyGuidance(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: ClassVar[str] = "verify_guidance"
    text: str = GUIDANCE

    async def apply(self, view: View, ctx: Context) -> View:
        if view.checkpoint.guidance is not None or not (view.offloads or view.checkpoint.handles):
            return view
        if not view.compacting:
            # Handles made after this stage (the token safeguard folds a summary, or cuts an
            # output to an excerpt): the note waits for the next compaction point, so the prefix
            # of the requests in between stays byte for byte the same.
            return view
        note = {"role": "system", "content": self.text}
        at = view.conversation().prefix_end
        view.replace_messages(
            [*view.messages[:at], note, *view.messages[at:]],
            self.name,
            origin=[*view.origin[:at], -1, *view.origin[at:]],
        )
        view.checkpoint = replace(view.checkpoint, guidance=note)
        return view
