"""A fake OpenAI **Responses API** server (``POST /v1/responses``) that plays the MODEL of an
agent loop, the Responses counterpart of ``tests.agent_upstream.AgentUpstream``.

It decides each answer from the request, deterministically, the way a reasoning model driving
a real agent would, and checks what it receives the way the real server does:

- **The window.** A request whose input tokens (the project's own count,
  ``ResponsesDialect().count``) plus ``max_output_tokens`` exceed ``window`` gets OpenAI's real
  answer: HTTP 400 ``context_length_exceeded`` (``param: input``).
- **The protocol.** Every ``function_call``/``custom_tool_call``/``local_shell_call`` in
  ``input`` has its output (same ``call_id``) later in ``input``, every output answers an
  earlier call, no call id is used twice, and a ``reasoning`` item is followed by another output
  item of its turn (not last, not followed by a user message or a tool output). Problems are
  recorded per request (``strict=True`` also refuses such a request with the 400 OpenAI sends).
- **Reasoning.** Every ``reasoning`` item it emits carries an ``encrypted_content``; when an
  item comes back in a later ``input``, its ``encrypted_content`` must be byte-identical to what
  was emitted (and its id one the server issued). Differences are recorded.
- **Leaks.** A request that is not a read follow-up round (its last input item is not a
  ``read_tool_output`` result) must hold no ``read_tool_output`` call or result: those come
  from the client's own history, which must never have seen one.

The scripted agent works through ``steps`` steps: each answer is a ``reasoning`` item and one
call of the client's own tool (Codex's ``exec_command``/``shell``, or a function tool of the
test) with arguments that make the client produce a large output; then a final ``message``
``DONE: ...``. When the proxy offers ``read_tool_output`` and the input names a saved output
(``handle=out_<hex>``), it reads one (``reasoning`` + ``function_call read_tool_output``) once
at least ``read_every`` steps passed since its last read; the proxy answers the call itself
and asks again (a *read follow-up round*). A request without any function tool (Codex's own
compaction request: ``tools: []`` and a summary prompt) gets a plain summary message and does
not advance the run.

It is not OpenAI: it has no ``/v1/responses/compact`` (a 404, as every other route), answers a
request whose ``input`` holds a ``compaction_trigger`` as any other (it does not know the item,
so Codex's remote compaction v2 gets no ``compaction`` output item), and refuses an ``input``
with a ``compaction`` item (400: it cannot read OpenAI's encrypted compaction).

It fails the N-th read follow-up round on demand: an HTTP status (500, 429 with
``retry-after``), or a connection reset after some events of the answer's stream (before any
byte for a non-streamed request). With ``read_preamble`` the read answer streams that text
before its call, so a later failure comes after text already reached the client.

It streams exactly like OpenAI (``event: <type>`` + ``data: {json}``, ``response.created``,
``response.in_progress``, per item ``output_item.added`` ... ``output_item.done`` with
``content_part``/``output_text``, ``function_call_arguments`` and ``reasoning_summary_*`` events,
``response.completed`` with the full response object; every event numbered by
``sequence_number``); the non-streamed answer is that same response object.

The state of a run is keyed by the client's ``X-Agent-Run`` header, else Codex's
``session-id`` header, else the first user message: never by item counts, since the proxy
removes and summarizes old items. It runs in a thread with its own event loop.

Modules: ``protocol`` (names, item types, OpenAI's error bodies, ``Failure``), ``checks`` (what
is checked in every input), ``records`` (runs and requests as seen, what tests read back),
``script`` (the scripted run and the model's decisions), ``wire`` (answers encoded as OpenAI
sends them), ``server`` (``ResponsesUpstream``: the model on loopback). Import the names from
here.
"""

from tests.agent_upstream.protocol import STEP_MARK
from tests.agent_upstream.script import shell_command, step_output
from tests.responses_upstream.checks import is_read_follow_up, protocol_problems
from tests.responses_upstream.protocol import (
    DONE_PREFIX,
    HANDLE,
    READ_TOOL,
    RUN_HEADER,
    SUMMARY_PREFIX,
    Failure,
    context_length_error,
    invalid_request,
    rate_limit_error,
    server_error,
)
from tests.responses_upstream.records import Conversation, Seen
from tests.responses_upstream.server import ResponsesUpstream

__all__ = [
    "DONE_PREFIX",
    "HANDLE",
    "READ_TOOL",
    "RUN_HEADER",
    "STEP_MARK",
    "SUMMARY_PREFIX",
    "Conversation",
    "Failure",
    "ResponsesUpstream",
    "Seen",
    "context_length_error",
    "invalid_request",
    "is_read_follow_up",
    "protocol_problems",
    "rate_limit_error",
    "server_error",
    "shell_command",
    "step_output",
]
