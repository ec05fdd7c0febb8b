"""The doors a replay goes through: a recorded run (Chat Completions messages) written as the
request of each wire format the proxy compacts, and the recorded upstream's answers written
back in that format, each by the proxy's own dialect adapter (``proxy/dialects``).

A case's messages become, for ``responses``: ``instructions``-free ``input`` items (system and
user messages as ``message`` items, an assistant message as a ``message`` item and one
``function_call`` per tool call, tool results as ``function_call_output``), tools as flat
Responses function tools. For ``anthropic`` (Messages): the system messages as ``system``, an
assistant message as ``text`` and ``tool_use`` blocks, the tool results of one assistant message
as ``tool_result`` blocks of the next user message, tools with ``input_schema``, and the
``max_tokens`` the API requires (1,024: the policies' own answer reserve, so the same
decisions). The proxy reads each back into the same neutral conversation, so the same policy
makes the same decisions through every door (a test compares them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.conversation import Message
from proxy.dialects import DOORS, Dialect, make_dialects
from proxy.dialects.base import Parsed

# The doors a replay drives: those whose body says everything (the Gemini doors' model and stream
# are their path's: `replay --dialect gemini` is not written yet).
REPLAY_DOORS = tuple(door for door in DOORS if door.stream is None)
DIALECTS = tuple(door.dialect for door in REPLAY_DOORS)
PATHS = {door.dialect: door.path.decode() for door in REPLAY_DOORS}


def adapter(dialect: str) -> Dialect:
    return make_dialects()[dialect]


def request(dialect: str, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
    """The request body a client of ``dialect`` sends for this history."""
    return adapter(dialect).client_request(model, messages, tools)


def read(dialect: str, body: dict[str, Any]) -> Parsed:
    """A received request as the proxy reads it."""
    return adapter(dialect).parse(body)


def neutral_messages(dialect: str, body: dict[str, Any]) -> list[Message]:
    """The messages a received request holds, in the neutral (chat) form."""
    messages: list[Message] = read(dialect, body).neutral["messages"]
    return messages


def tool_names(parsed: Parsed) -> tuple[str, ...]:
    """The names of the tools a request declares (function tools and the others alike)."""
    tools = parsed.neutral.get("tools")
    names = []
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict):
            function = tool.get("function")
            names.append(str(function.get("name") if isinstance(function, dict) else tool.get("name")))
    return tuple(names)


def chat_request(parsed: Parsed) -> dict[str, Any]:
    """A request of any door as a Chat Completions one (for an answering model that speaks
    chat): its neutral messages and function tools."""
    neutral = parsed.neutral
    chat: dict[str, Any] = {"model": neutral.get("model"), "messages": neutral["messages"]}
    tools = neutral.get("tools")
    if isinstance(tools, list) and tools:
        chat["tools"] = [t for t in tools if isinstance(t, dict) and "function" in t]
    return chat


def answer(
    dialect: str, message: Message, model: Any, answer_id: str, usage: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A Chat Completions answer's message as ``dialect``'s answer."""
    return adapter(dialect).answer_from_chat(message, model, answer_id, usage)
