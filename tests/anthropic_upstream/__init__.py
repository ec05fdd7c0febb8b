"""A fake **Anthropic Messages API** server that plays the MODEL of an agent loop, the
Anthropic counterpart of ``tests.responses_upstream.ResponsesUpstream``.

It decides each answer from the request, deterministically, the way Claude driving a real agent
would, and checks what it receives the way the real server does:

- **Routes.** ``POST /v1/messages`` (also ``?beta=true``, as Claude Code calls it),
  ``POST /v1/messages/count_tokens`` (``{"input_tokens": n}``), ``HEAD /`` and ``GET /`` (Claude
  Code probes them: 200); anything else 404 with an Anthropic error body. Every answer carries a
  ``request-id`` header like the real API's.
- **Tokens** (``tokens.py``). Its own "Claude tokenizer": o200k (offline) times ``factor``
  (1.2) plus overheads, so it differs from any OpenAI count like the real one does, and
  ``count_tokens(body)`` / ``AnthropicUpstream.count`` let tests compare the proxy's estimate
  with it. Prompt caching by the real rule: ``cache_read_input_tokens`` is the longest prefix an
  earlier request of the run cached at a ``cache_control`` breakpoint (20-block lookback),
  ``cache_creation_input_tokens`` what this request caches beyond it, ``input_tokens`` the rest;
  more than 4 breakpoints is the real 400.
- **The window.** A prompt plus ``max_tokens`` over ``window`` gets the real 400
  ``invalid_request_error``: ``prompt is too long: N tokens > W maximum`` (the prompt alone is
  over), else ``input length and `max_tokens` exceed context limit: N + M > W, ...``.
- **The protocol** (``protocol.py``): first message ``user``; every ``tool_use`` answered by a
  ``tool_result`` at the start of the next message; no ``tool_result`` without its ``tool_use``;
  unique ids; with thinking on, the current tool-use turn's assistant message starts with a
  thinking block; every thinking signature (redacted data) comes back byte for byte in the
  message it was emitted in. Recorded per request (``strict=True`` refuses with the real 400);
  consecutive same-role messages, which the API merges, are noted apart (``merged``).
- **Leaks.** ``read_tool_output`` calls and results may appear only in the proxy's read
  follow-up rounds (the last user message answers a read call), never in a client's history.
- **The scripted agent** (``agent.py``): ``steps`` steps of ``thinking`` + text + one
  ``tool_use`` of the client's tool (``Bash`` for Claude Code), then ``DONE: ...``; reads saved
  outputs when the proxy offers ``read_tool_output`` (with a text preamble, or beside a client
  tool_use: a *mixed* answer); Claude Code's own compaction request, or one without tools, gets
  a ``SUMMARY:`` text and does not advance the run.
- **The wire** (``wire.py``): non-streamed message objects and SSE streams exactly as the API
  writes them (``message_start``, ``content_block_*`` with ``thinking_delta``/``signature_delta``/
  ``text_delta``/``input_json_delta``, ``ping``, ``message_delta``, ``message_stop``).
- **Failures on demand** (``Failure``): the N-th request or read follow-up round answers
  400/401/429 (``retry-after`` and ``anthropic-ratelimit-*``)/500/529, or streams K events then
  an ``event: error`` (``overloaded_error``), or K events then a connection reset.

Runs are keyed by ``X-Agent-Run``, else Claude Code's ``X-Claude-Code-Session-Id``, else the
first user text. The server runs in a thread with its own event loop (``start()``/``stop()``,
or ``with AnthropicUpstream(...) as fake``).
"""

from __future__ import annotations

from tests.agent_upstream import STEP_MARK, shell_command, step_output
from tests.anthropic_upstream.agent import DONE_PREFIX, SUMMARY_PREFIX, Conversation, is_compaction
from tests.anthropic_upstream.errors import Failure, error_body, prompt_too_long
from tests.anthropic_upstream.protocol import (
    HANDLE,
    READ_TOOL,
    is_read_follow_up,
    protocol_problems,
    thinking_problems,
)
from tests.anthropic_upstream.record import Seen
from tests.anthropic_upstream.server import AnthropicUpstream
from tests.anthropic_upstream.tokens import ClaudeTokenizer, cache_usage, count_tokens

RUN_HEADER = "x-agent-run"

__all__ = [
    "DONE_PREFIX",
    "HANDLE",
    "READ_TOOL",
    "RUN_HEADER",
    "STEP_MARK",
    "SUMMARY_PREFIX",
    "AnthropicUpstream",
    "ClaudeTokenizer",
    "Conversation",
    "Failure",
    "Seen",
    "cache_usage",
    "count_tokens",
    "error_body",
    "is_compaction",
    "is_read_follow_up",
    "prompt_too_long",
    "protocol_problems",
    "shell_command",
    "step_output",
    "thinking_problems",
]
