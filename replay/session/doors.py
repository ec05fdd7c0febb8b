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
decisions). For ``gemini`` (the Gemini API's ``generateContent``): the system messages as
``systemInstruction``, an assistant message as a ``model`` content of a text part and
``functionCall`` parts, the tool results of one assistant message as one ``user`` content of
``functionResponse`` parts, tools as one ``functionDeclarations`` list, and the model in the
path (``/v1beta/models/{model}:generateContent``); ``code_assist`` is the same request in Code
Assist's envelope (``{model, project, request}``, at ``/v1internal:generateContent``). The
proxy reads each back into the same neutral conversation, so the same policy makes the same
decisions through every door (a test compares them).

A replay reads every answer whole: it drives each door's one-JSON-answer route (a body's
``stream`` is never set; a Gemini door's path asks for none), and the recorded upstream finds
a request's door, model and all, with the proxy's own door table (``DoorTable``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from policies.conversation import Message, message_text
from proxy.dialects import BODY_SAYS, DOORS, Dialect, Target, make_dialects
from proxy.dialects.base import Parsed
from proxy.dialects.doors import MODEL

# Doors that hold no conversation of their own: Gemini's countTokens answers with a count.
_NOT_CONVERSATIONS = ("gemini_count", "responses_compact")
# The doors a replay drives: per conversation dialect, the route that answers with one JSON
# body (the body's ``stream`` unset, or a path that asks for no stream).
REPLAY_DOORS = tuple(
    door for door in DOORS if door.stream is not True and door.dialect not in _NOT_CONVERSATIONS
)
DIALECTS = tuple(door.dialect for door in REPLAY_DOORS)
# Each door's path, ``{model}`` where the model goes (``request_path``).
PATHS = {door.dialect: door.path.decode() for door in REPLAY_DOORS}
# The header a door's clients send their key in (others: ``Authorization: Bearer``; Code
# Assist's clients send a Google login's token so).
KEY_HEADERS = {"gemini": "x-goog-api-key"}


def request_path(dialect: str, model: str) -> str:
    """The path a client of ``dialect`` posts a request for ``model`` to."""
    return PATHS[dialect].replace(MODEL.decode(), quote(model, safe=""))


def key_header(dialect: str, key: str) -> dict[str, str]:
    """The header carrying ``key`` as the door's clients send it."""
    name = KEY_HEADERS.get(dialect)
    return {name: key} if name else {"authorization": f"Bearer {key}"}


def adapter(dialect: str, target: Target = BODY_SAYS) -> Dialect:
    """``dialect``'s adapter, bound to what a request's path says (a Gemini door's model)."""
    return make_dialects()[dialect].at(target)


def request(dialect: str, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
    """The request body a client of ``dialect`` sends for this history (a Gemini door's model
    goes in its path: ``request_path``)."""
    return adapter(dialect).client_request(model, messages, tools)


def read(dialect: str, body: dict[str, Any], target: Target = BODY_SAYS) -> Parsed:
    """A received request as the proxy reads it (``target``: what its path says)."""
    return adapter(dialect, target).parse(body)


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


_ASKED = "(the question)"


def _as_last_turn(dialect: str, data: dict[str, Any], model: str) -> dict[str, Any]:
    """A request whose history is one user turn and then ``data``, ``dialect``'s JSON answer, as
    the model's turn (what a client sends next, less the results)."""
    if dialect == "chat":
        return {
            "model": model,
            "messages": [{"role": "user", "content": _ASKED}, data["choices"][0]["message"]],
        }
    if dialect == "responses":
        return {"model": model, "input": [{"role": "user", "content": _ASKED}, *data["output"]]}
    if dialect == "anthropic":
        turns = [{"role": "user", "content": _ASKED}, {"role": "assistant", "content": data["content"]}]
        return {"model": model, "max_tokens": 1024, "messages": turns}
    inner = data["response"] if dialect == "code_assist" else data
    contents = [{"role": "user", "parts": [{"text": _ASKED}]}, inner["candidates"][0]["content"]]
    return (
        {"model": model, "request": {"contents": contents}}
        if dialect == "code_assist"
        else {"contents": contents}
    )


def answer_message(dialect: str, data: Any, model: str) -> Message | None:
    """``dialect``'s JSON answer (the proxy's, to a request for ``model``) as one neutral
    assistant message, its text and tool calls, read by the door's own adapter (None: no
    answer in it)."""
    try:
        body = _as_last_turn(dialect, data, model)
        parsed = adapter(dialect, Target(model=model, stream=False)).parse(body)
    except Exception:  # not the door's answer, or one its adapter refuses (a ProxyError)
        return None
    replies = [m for m in parsed.neutral["messages"] if m.get("role") == "assistant"]
    if not replies:
        return None
    texts = [message_text(m) for m in replies if message_text(m)]
    calls = [c for m in replies for c in m.get("tool_calls") or []]
    message: Message = {"role": "assistant", "content": "\n".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    return message
