"""The token budget of one request, shared by the stages that decide how large a view may be.

A view is judged as the whole request the upstream receives: the messages, the tool schemas,
the answer's reserve (the policy's, or the request's own ``max_tokens`` when larger, since a
real server counts it against the window) and, once the view names a saved output, the read
tool's schema the proxy adds. A view that names saved outputs also keeps the *read room* free
under the window, so that the model's first read of any handle returns content instead of "no
room is left".
"""

from __future__ import annotations

from policies.view import Context, View

# The read room is never more than this share of the window (at a tiny window, a fixed 1,000
# tokens would leave nothing for the conversation).
MAX_READ_ROOM_SHARE = 0.25


def read_room_for(window: int, min_tokens: int, share: float) -> int:
    """The larger of ``min_tokens`` and ``share`` x window, at most a quarter of the window."""
    return int(min(max(min_tokens, share * window), MAX_READ_ROOM_SHARE * window))


def answer_reserve(ctx: Context) -> int:
    return max(ctx.reserve_tokens, ctx.answer_tokens)


def names_handles(view: View) -> bool:
    return bool(view.checkpoint.handles or view.offloads)


def whole_request(view: View, ctx: Context, *, handles: bool | None = None) -> int:
    """The view's tokens plus the answer's reserve and, when it names saved outputs (or
    ``handles`` says it will), the read tool's schema."""
    named = names_handles(view) if handles is None else handles
    return view.tokens(ctx) + answer_reserve(ctx) + (ctx.injected_tokens if named else 0)


def read_ceiling(ctx: Context) -> int:
    """The largest whole request that still leaves the read room free."""
    return ctx.window - ctx.read_room


def over_read_ceiling(view: View, ctx: Context) -> bool:
    return names_handles(view) and whole_request(view, ctx) > read_ceiling(ctx)
