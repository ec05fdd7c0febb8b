"""A fake OpenAI Chat Completions server that plays the MODEL of an agent loop.

Unlike ``FakeUpstream`` (replies queued by the test), this server decides each answer from
the request, deterministically, the way a model driving a real agent would:

- it works through ``steps`` steps, one call of the client's own tool per step (arguments
  that make the client produce a large output), then gives a final answer;
- it enforces a context window like OpenAI: a request whose prompt tokens (the project's own
  counter, o200k) plus ``max_tokens``/``max_completion_tokens`` exceed ``window`` gets
  OpenAI's real 400 ``context_length_exceeded`` answer, or another server's in its own words
  (``flavor``: vllm, llamacpp, ollama, lmstudio);
- it tells its window where that kind of server does (``metadata``): ``vllm`` (``/v1/models``
  ``max_model_len``), ``llamacpp`` (``/props`` ``n_ctx``), ``ollama`` (``/api/show``
  ``num_ctx``), ``lmstudio`` (``/api/v0/models/<model>``); ``none``: only in its refusals;
- it checks the tool-call protocol of every request it receives and records each problem;
- when the proxy offers ``read_tool_output`` and the messages name a saved output
  (``handle=out_...``), it reads one now and then (``read_every`` steps) before going on;
  the proxy answers that call itself and asks again (a *read follow-up round*);
- it fails a chosen read follow-up round on demand: an HTTP error status, or a connection
  reset in the middle of the stream;
- with ``prefix_cache=True``, it reports ``usage.prompt_tokens_details.cached_tokens`` as OpenAI's
  automatic prefix caching does (the longest common token prefix with a recent prompt);
- it streams exactly like OpenAI (``chat.completion.chunk`` events, tool calls as deltas,
  a finishing chunk, a usage-only chunk when ``stream_options.include_usage``, ``[DONE]``).

Agents without tools (text actions, e.g. mini-swe-agent's text mode) get a THOUGHT line and
one fenced action block per step, and a final step with a submission command.

The state of each conversation is keyed by the client's ``X-Agent-Run`` header when it sends
one (a run marker that survives anything the proxy does to the messages), else by its first
user message; never by message counts, since the proxy removes and summarizes old messages.
Each request also records whether its first user message is still the task as first sent.
Like ``FakeUpstream``, it runs in a thread with its own event loop.

Modules: ``protocol`` (names, OpenAI's error bodies, the tool-call protocol check),
``records`` (conversations and requests as seen, what tests read back), ``script`` (the scripted
run and the model's decisions), ``wire`` (answers encoded as OpenAI sends them), ``server``
(``AgentUpstream``: the model on loopback), ``prefix_cache`` (OpenAI's automatic prefix caching,
the ``cached_tokens`` it reports with ``prefix_cache=True``). Import the names from here.
"""

from tests.agent_upstream.protocol import (
    DONE_PREFIX,
    HANDLE,
    READ_TOOL,
    RUN_HEADER,
    STEP_MARK,
    Failure,
    context_length_error,
    is_read_follow_up,
    protocol_problems,
    rate_limit_error,
    refusal_body,
    server_error,
)
from tests.agent_upstream.records import Conversation, Seen
from tests.agent_upstream.script import Answer, Call, shell_command, step_output, step_output_lines
from tests.agent_upstream.server import AgentUpstream

__all__ = [
    "DONE_PREFIX",
    "HANDLE",
    "READ_TOOL",
    "RUN_HEADER",
    "STEP_MARK",
    "AgentUpstream",
    "Answer",
    "Call",
    "Conversation",
    "Failure",
    "Seen",
    "context_length_error",
    "is_read_follow_up",
    "protocol_problems",
    "rate_limit_error",
    "refusal_body",
    "server_error",
    "shell_command",
    "step_output",
    "step_output_lines",
]
