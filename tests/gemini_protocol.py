"""The Gemini API's rules for a request's ``contents``, as its server enforces them: what no view
the proxy sends may break (used by the dialect's tests and the fake Gemini upstream).

- there are contents, the first is the user's, each has parts, each part has one kind of data
  (text, inlineData, fileData, functionCall, functionResponse, executableCode,
  codeExecutionResult) besides its metadata (``thought``, ``thoughtSignature``);
- a model content's ``functionCall`` parts are answered by the very next content, a user one,
  with as many ``functionResponse`` parts (the API's "the number of function response parts is
  equal to the number of function call parts of the function call turn"), each naming a call of
  that turn (by id when both have one, else by name);
- a ``functionResponse`` content follows the call turn it answers, never anything else.

Thought signatures (``signature_problems``): a signature the server gave comes back exactly as
given, on the part it came with (``skip_thought_signature_validator`` passes), and in the
current turn (the contents after the last user text) every call the server made that carried
one still carries it: "Function call is missing a thought_signature".
"""

from __future__ import annotations

from typing import Any

import orjson

DATA = (
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
)
SKIP_SIGNATURE = "skip_thought_signature_validator"


def _parts(content: Any) -> list[Any]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return parts if isinstance(parts, list) else []


def calls_of(content: Any) -> list[dict[str, Any]]:
    return [
        p["functionCall"]
        for p in _parts(content)
        if isinstance(p, dict) and isinstance(p.get("functionCall"), dict)
    ]


def responses_of(content: Any) -> list[dict[str, Any]]:
    return [
        p["functionResponse"]
        for p in _parts(content)
        if isinstance(p, dict) and isinstance(p.get("functionResponse"), dict)
    ]


def _part_problems(where: str, content: Any) -> list[str]:
    found: list[str] = []
    if not isinstance(content, dict) or content.get("role", "user") not in ("user", "model"):
        return [f"{where}: not a content of role user or model"]
    parts = _parts(content)
    if not parts:
        found.append(f"{where} has no parts")
    for position, part in enumerate(parts):
        kinds = [k for k in DATA if isinstance(part, dict) and k in part]
        if len(kinds) != 1:
            found.append(f"{where}.parts[{position}] has {len(kinds)} kinds of data")
    return found


def _answer_problems(where: str, calls: list[dict[str, Any]], answers: list[dict[str, Any]]) -> list[str]:
    if len(answers) != len(calls):
        return [f"{where} answers {len(answers)} of the {len(calls)} function calls before it"]
    ids = {c.get("id") for c in calls if c.get("id")}
    names = [c.get("name") for c in calls]
    for answer in answers:
        if answer.get("id") and ids and answer["id"] not in ids:
            return [f"{where} answers a call not made just before it: {answer['id']}"]
        if answer.get("name") not in names:
            return [f"{where} answers a function not called just before it: {answer.get('name')}"]
    return []


def problems(body: dict[str, Any]) -> list[str]:
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return ["no contents"]
    found: list[str] = []
    if isinstance(contents[0], dict) and contents[0].get("role", "user") != "user":
        found.append("the first content is not the user's")
    for index, content in enumerate(contents):
        where = f"contents[{index}]"
        found += _part_problems(where, content)
        answers = responses_of(content)
        previous = calls_of(contents[index - 1]) if index else []
        if answers and (content.get("role", "user") != "user" or not previous):
            found.append(f"{where} holds function responses without the call turn before it")
        elif previous:
            found += _answer_problems(where, previous, answers)
        if calls_of(content) and index == len(contents) - 1:
            found.append(f"{where} calls functions no content answers")
    return found


def signed(body: dict[str, Any]) -> list[tuple[int, int, str]]:
    """(content, part, signature) of every signed part."""
    return [
        (index, position, part["thoughtSignature"])
        for index, content in enumerate(body.get("contents") or [])
        for position, part in enumerate(_parts(content))
        if isinstance(part, dict) and isinstance(part.get("thoughtSignature"), str)
    ]


def current_turn(contents: list[Any]) -> int:
    """Where the current turn starts: the last user content with a text part."""
    for index in range(len(contents) - 1, -1, -1):
        content = contents[index]
        if content.get("role", "user") == "user" and any("text" in p for p in _parts(content)):
            return index
    return 0


def call_key(call: dict[str, Any]) -> str:
    """A call as the server made it: its name and arguments (a client may add an ``id``)."""
    return orjson.dumps([call.get("name"), call.get("args")], option=orjson.OPT_SORT_KEYS).decode()


def _same_part(part: dict[str, Any], given: dict[str, Any]) -> bool:
    """The part a signature came on: the same call, or a text (a client may join the text
    pieces before it)."""
    if "functionCall" in given:
        call = part.get("functionCall")
        return isinstance(call, dict) and call_key(call) == call_key(given["functionCall"])
    return isinstance(part.get("text"), str) and isinstance(given.get("text"), str)


def signature_problems(body: dict[str, Any], emitted: dict[str, Any], calls: dict[str, str]) -> list[str]:
    """``emitted``: signature -> the part the server gave it on; ``calls``: every call the
    server made with a signature (``call_key``) -> that signature."""
    found: list[str] = []
    contents = body.get("contents") or []
    for index, position, signature in signed(body):
        part = contents[index]["parts"][position]
        if signature == SKIP_SIGNATURE:
            continue
        given = emitted.get(signature)
        if given is None:
            found.append(f"contents[{index}].parts[{position}]: a thought signature the server never gave")
        elif not _same_part(part, given):
            found.append(
                f"contents[{index}].parts[{position}]: a thought signature on another part than its own"
            )
    for index in range(current_turn(contents), len(contents)):
        for call_part in _parts(contents[index]):
            call = call_part.get("functionCall") if isinstance(call_part, dict) else None
            if isinstance(call, dict) and call_key(call) in calls and "thoughtSignature" not in call_part:
                found.append(
                    f"contents[{index}]: Function call is missing a thought_signature in functionCall parts."
                )
    return found
