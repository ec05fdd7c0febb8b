"""A door the proxy does not ship, written the way ``proxy/README.md`` ("How to add a door")
asks: a ``BaseDialect`` subclass and nothing else. Its wire format is a toy:

    {"model", "system", "turns": [{"who": "user"|"agent"|"tool"|"system", "say", "act", "re"}],
     "tools": [{"name", "about", "params"}], "limit", "stream"}

An agent turn's ``act`` holds its calls (``{"id", "tool", "args"}``, arguments as an object); a
tool turn answers the call named by ``re``. An answer is ``{"id", "turn", "usage": {"in",
"out", "all"}}``; a streamed answer is ``data: {"say"}`` / ``data: {"act"}`` /
``data: {"usage"}`` events ending in ``data: {"done": true}``. Turns are read into Chat
Completions messages and written back; a turn the view left untouched goes exactly as it came
(the ``ts`` field, which no neutral message keeps, shows it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from policies.conversation import Message
from proxy.dialects.base import Answer, BaseDialect, Parsed
from proxy.read_tool.tool import TOOL_NAME, tool_schema
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter
from proxy.wire.sse_framer import event_data


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"a turn's text must be a string, not {type(value).__name__}")
    return value


def to_message(turn: dict[str, Any]) -> Message:
    """One toy turn as a neutral (Chat Completions) message."""
    who = turn["who"]
    if who in ("user", "system"):
        return {"role": who, "content": _text(turn["say"])}
    if who == "tool":
        return {"role": "tool", "tool_call_id": turn["re"], "content": _text(turn["say"])}
    calls = [
        {
            "id": act["id"],
            "type": "function",
            "function": {"name": act["tool"], "arguments": orjson.dumps(act["args"]).decode()},
        }
        for act in turn.get("act") or []
    ]
    message: dict[str, Any] = {"role": "assistant", "content": turn.get("say")}
    if calls:
        message["tool_calls"] = calls
    return message


def to_turn(message: Message) -> dict[str, Any]:
    """A neutral message (a placeholder, a summary, an inserted note) as a toy turn."""
    role, content = message.get("role"), message.get("content")
    text = content if isinstance(content, str) else orjson.dumps(content).decode()
    if role == "tool":
        return {"who": "tool", "re": message.get("tool_call_id"), "say": text}
    if role == "assistant":
        acts = [
            {
                "id": call["id"],
                "tool": call["function"]["name"],
                "args": orjson.loads(call["function"]["arguments"] or "{}"),
            }
            for call in message.get("tool_calls") or []
        ]
        return {"who": "agent", "say": content, **({"act": acts} if acts else {})}
    return {"who": "system" if role == "system" else "user", "say": text}


def read_tool(max_lines: int) -> dict[str, Any]:
    function = tool_schema(max_lines)["function"]
    return {"name": TOOL_NAME, "about": function["description"], "params": function["parameters"]}


class ToyDialect(BaseDialect):
    name = "toy"
    prompt_key = "in"
    output_key = "out"
    total_key = "all"
    max_tokens_key = "limit"
    history_field = "turns"

    def parse(self, body: Any, known: int = 0) -> Parsed:
        if not isinstance(body, dict):
            raise ProxyError(400, "The request body must be a JSON object.")
        turns = body.get("turns")
        if not isinstance(turns, list):
            raise ProxyError(400, "'turns' must be an array.", param="turns")
        messages: list[Message] = []
        if isinstance(body.get("system"), str):
            messages.append({"role": "system", "content": body["system"]})
        offset = len(messages)
        messages += [to_message(turn) for turn in turns]
        neutral: dict[str, Any] = {"model": body.get("model"), "messages": messages}
        tools = body.get("tools")
        if isinstance(tools, list):
            neutral["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t.get("about", ""),
                        "parameters": t.get("params", {}),
                    },
                }
                for t in tools
            ]
        if isinstance(body.get("limit"), int):
            neutral["max_tokens"] = body["limit"]
        return Parsed(
            body=body,
            neutral=neutral,
            stream=body.get("stream") is True,
            skipped=None,
            # How many leading turns the conversation's last request had (read then, not now).
            notes={"turns": len(turns), **({"known_turns": known} if known else {})},
            private=(offset, messages),
        )

    def render(self, parsed: Parsed, view: Sequence[Message], origin: Sequence[int]) -> dict[str, Any]:
        offset, messages = parsed.private
        turns = parsed.body["turns"]
        body = {k: v for k, v in parsed.body.items() if k != "system"}
        rendered: list[dict[str, Any]] = []
        for message, index in zip(view, origin, strict=True):
            if index >= 0 and message is messages[index]:
                if index >= offset:
                    rendered.append(turns[index - offset])  # untouched: as it came
                else:
                    body["system"] = message["content"]
            else:
                rendered.append(to_turn(message))
        return {**body, "turns": rendered}

    def with_read_tool(self, body: dict[str, Any], max_lines: int) -> dict[str, Any]:
        return {**body, "tools": [*(body.get("tools") or []), read_tool(max_lines)]}

    def without_read_tool(self, body: dict[str, Any]) -> dict[str, Any]:
        tools = [t for t in body.get("tools") or [] if t.get("name") != TOOL_NAME]
        return {**body, "tools": tools} if tools else {k: v for k, v in body.items() if k != "tools"}

    def is_read_call(self, call: Any) -> bool:
        return isinstance(call, dict) and call.get("tool") == TOOL_NAME

    def call_arguments(self, call: Any) -> Any:
        return call.get("args") if isinstance(call, dict) else None

    def json_answer(self, data: Any) -> Answer | None:
        turn = data.get("turn") if isinstance(data, dict) else None
        if not isinstance(turn, dict):
            return None
        say, calls = turn.get("say"), list(turn.get("act") or [])
        return Answer(
            calls=calls,
            text=say if isinstance(say, str) else None,
            usage=data.get("usage") if isinstance(data.get("usage"), dict) else None,
            items=calls,
        )

    def add_round(
        self, body: dict[str, Any], answer: Answer, results: Sequence[tuple[Any, str]]
    ) -> dict[str, Any]:
        agent = {"who": "agent", "say": answer.text, "act": [call for call, _ in results]}
        answered = [{"who": "tool", "re": call["id"], "say": text} for call, text in results]
        return {**body, "turns": [*body["turns"], agent, *answered]}

    def final_json(self, data: dict[str, Any], total_usage: dict[str, int]) -> bytes:
        turn = data["turn"]
        acts = [a for a in turn.get("act") or [] if not self.is_read_call(a)]
        turn["act"] = acts
        if total_usage:
            data["usage"] = {**(data.get("usage") or {}), **total_usage}
        return orjson.dumps(data)

    def codec(self, writer: ResponseWriter) -> ToyStream:
        return ToyStream(writer, self.is_read_call)

    def error_event(self, error: ProxyError) -> bytes:
        return b"data: " + orjson.dumps({"oops": error.message}) + b"\n\n"

    def decision(self, raw: bytes, sse: bool) -> str:
        return "stream" if sse else "answer"

    def client_request(self, model: str, messages: Sequence[Message], tools: Sequence[Any]) -> dict[str, Any]:
        return {"model": model, "turns": [to_turn(m) for m in messages], "tools": list(tools)}

    def answer_from_chat(
        self, message: Message, model: Any, answer_id: str, usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {"id": answer_id, "turn": to_turn(message), "usage": usage}


def toy_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class ToyStream:
    """The toy's stream codec: text relayed as it comes, calls held until the round ends (a
    read round's calls never reach the client), the agent's calls and the summed usage at the
    end."""

    def __init__(self, writer: ResponseWriter, is_read_call: Any) -> None:
        self.writer = writer
        self.is_read_call = is_read_call
        self.usage: dict[str, Any] | None = None
        self.complete = False
        self.error: Any = None
        self._text: list[str] = []
        self._calls: list[Any] = []

    @property
    def text(self) -> str:
        return "".join(self._text)

    async def take(self, event: bytes) -> None:
        data = event_data(event)
        if not data:
            return
        payload = orjson.loads(data)
        if "say" in payload:
            self._text.append(payload["say"])
            await self.writer.write(toy_event(payload))
        elif "act" in payload:
            self._calls.append(payload["act"])
        elif "usage" in payload:
            self.usage = payload["usage"]
        elif "oops" in payload:
            self.error = payload
        elif payload.get("done"):
            self.complete = True

    async def take_all(self, events: list[bytes]) -> None:
        for event in events:
            await self.take(event)

    def calls(self) -> list[Any]:
        return list(self._calls)

    def items(self) -> list[Any]:
        return list(self._calls)

    async def finish(self, total_usage: dict[str, int]) -> None:
        for call in self._calls:
            if not self.is_read_call(call):
                await self.writer.write(toy_event({"act": call}))
        await self.writer.write(toy_event({"usage": total_usage or self.usage}))
        await self.writer.finish(toy_event({"done": True}))
