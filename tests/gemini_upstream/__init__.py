"""A fake **Gemini API** (and Gemini CLI's Code Assist) server that plays the MODEL of an agent
loop, the Gemini counterpart of ``tests.anthropic_upstream.AnthropicUpstream``.

It decides each answer from the request, deterministically, and checks what it receives the way
the real server does:

- **Routes.** ``POST /v1beta/models/{model}:generateContent`` (a ``GenerateContentResponse``),
  ``:streamGenerateContent?alt=sse`` (``data:`` events, ``\\r\\n\\r\\n`` between them; without
  ``alt=sse`` a JSON array), ``:countTokens`` (``{"totalTokens": n}``), ``GET
  /v1beta/models/{model}`` (``inputTokenLimit``); ``POST /v1internal:generateContent`` and
  ``:streamGenerateContent`` (Code Assist: ``{model, project, request}`` in, ``{"response": ...}``
  out, each event too); anything else 404 in Google's shape.
- **Tokens** (``tokens.py``): its own count (o200k times ``factor`` plus overheads), reported in
  ``usageMetadata`` (``promptTokenCount``, ``candidatesTokenCount``, ``totalTokenCount``).
- **The window.** A prompt over ``window`` gets the real 400 ``INVALID_ARGUMENT``: "The input
  token count (N) exceeds the maximum number of tokens allowed (M)."
- **The protocol** (``tests/gemini_protocol.py``): the first content the user's; every
  ``functionCall`` content answered by the next content, part for part; no function response
  without its call turn; every thought signature it gave echoed on the part it came with, and in
  the current turn every signed call still signed. ``strict`` (default) refuses a problem with
  the API's 400; each is recorded per request either way (``Seen``).
- **Leaks.** ``read_tool_output`` calls may appear only in the proxy's read rounds, never in a
  client's history.
- **The scripted model** (``agent.py``): ``steps`` calls of the client's tool (Gemini CLI's
  ``run_shell_command``), each signed, then ``DONE: ...``; reads a named saved output when the
  proxy offers ``read_tool_output``; Gemini CLI's own compression request gets a ``SUMMARY:``.
- **Keys.** With ``api_key``, another key in ``x-goog-api-key`` or ``?key=`` gets the API's 400
  ``API_KEY_INVALID``.

Runs are keyed by ``X-Agent-Run``, else the first user texts. The server runs in a thread with
its own event loop (``start()``/``stop()``, or ``with GeminiUpstream(...) as fake``).
"""

from __future__ import annotations

from tests.gemini_upstream.agent import DONE_PREFIX, HANDLE, READ_TOOL, SUMMARY_PREFIX
from tests.gemini_upstream.server import GeminiUpstream, Seen

__all__ = ["DONE_PREFIX", "HANDLE", "READ_TOOL", "SUMMARY_PREFIX", "GeminiUpstream", "Seen"]
