"""What the real Messages API checks in a request's ``messages``, as pure functions.

- **Structure** (``protocol_problems``): the first message is ``user``; no empty message or
  text block; every ``tool_use`` id of an assistant message is answered by a ``tool_result``
  at the start of the next (user) message; no ``tool_result`` without its ``tool_use`` in the
  previous message; ``tool_use`` ids unique; with ``thinking`` enabled, the last assistant
  message of a tool-use turn starts with a ``thinking``/``redacted_thinking`` block. The API
  merges consecutive messages of one role before checking (so does this), and that merge is
  noted separately (``merged``): it is not an error.
- **Thinking blocks** (``thinking_problems``): a ``thinking`` block's ``signature`` (a
  ``redacted_thinking`` block's ``data``) must be one the fake emitted, with its thinking text
  byte for byte, in a message whose blocks are the ones it was emitted with.
- **Thinking budget** (``thinking_budget_error``): at least 1024 tokens, and below
  ``max_tokens`` unless the interleaved-thinking beta is on.
- **Leaks** (``leaks``): ``read_tool_output`` calls and results belong only to the proxy's own
  read rounds (a follow-up round, or rounds the proxy put back where they happened), never to a
  history the client wrote.

Messages are the real API's (``messages.N.content.M: ...``); a detail for the test reader, if
any, follows in brackets and is cut off before the message is sent back in a 400.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from tests.anthropic_upstream.errors import THINKING_DOCS

READ_TOOL = "read_tool_output"
HANDLE = re.compile(r"handle=(out_[0-9a-f]{16})")
THINKING_KINDS = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True)
class Emitted:
    """A thinking (or redacted thinking) block the fake emitted, and its whole message."""

    text: str  # the thinking text (the data of a redacted block)
    message: tuple[Any, ...]  # canonical blocks of the answer it was emitted in


def blocks(message: Any) -> list[Any]:
    """A message's content as a list of blocks (a string is one text block)."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def _kind(block: Any) -> str | None:
    return block.get("type") if isinstance(block, dict) else None


def canonical(block: Any) -> Any:
    """What identifies a content block (fields a client may add or drop, such as
    ``cache_control`` or ``citations: null``, left out)."""
    kind = _kind(block)
    if kind == "text":
        return ("text", block.get("text"))
    if kind == "thinking":
        return ("thinking", block.get("thinking"), block.get("signature"))
    if kind == "redacted_thinking":
        return ("redacted_thinking", block.get("data"))
    if kind == "tool_use":
        return (
            "tool_use",
            block.get("id"),
            block.get("name"),
            orjson.dumps(block.get("input"), option=orjson.OPT_SORT_KEYS),
        )
    if isinstance(block, dict):
        block = {k: v for k, v in block.items() if k != "cache_control"}
    return orjson.dumps(block, option=orjson.OPT_SORT_KEYS, default=str)


@dataclass
class _Merged:
    role: Any
    items: list[tuple[int, int, Any]]  # (message index, block index, block)


def _merge(messages: list[Any]) -> tuple[list[_Merged], list[str]]:
    merged: list[_Merged] = []
    notes: list[str] = []
    for m, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        items = [(m, n, b) for n, b in enumerate(blocks(message))]
        if merged and merged[-1].role == role:
            notes.append(
                f"messages.{m}: a second `{role}` message in a row (the API merges it into the previous one)"
            )
            merged[-1].items.extend(items)
        else:
            merged.append(_Merged(role, items))
    return merged, notes


def protocol_problems(messages: list[Any], thinking: bool) -> tuple[list[str], list[str]]:
    """(problems the real API refuses with a 400, consecutive same-role messages it merges)."""
    problems: list[str] = []
    if not messages:
        return ["messages: at least one message is required"], []
    merged, notes = _merge(messages)
    if merged[0].role != "user":
        problems.append('messages: first message must use the "user" role')
    for m, message in enumerate(messages):
        if not blocks(message) and not (m == len(messages) - 1 and message.get("role") == "assistant"):
            problems.append(
                f"messages.{m}: all messages must have non-empty content except for the optional final "
                "assistant message"
            )
        for n, block in enumerate(blocks(message)):
            if _kind(block) == "text" and not block.get("text"):
                problems.append(f"messages.{m}.content.{n}: text content blocks must be non-empty")
    used: set[Any] = set()
    for k, turn in enumerate(merged):
        following = merged[k + 1] if k + 1 < len(merged) else None
        if turn.role == "assistant":
            uses = [(m, n, b.get("id")) for m, n, b in turn.items if _kind(b) == "tool_use"]
            for m, n, use_id in uses:
                if use_id in used:
                    problems.append(f"messages.{m}.content.{n}: `tool_use` ids must be unique")
                used.add(use_id)
            leading: set[Any] = set()
            for _, _, block in following.items if following is not None else []:
                if _kind(block) != "tool_result":
                    break
                leading.add(block.get("tool_use_id"))
            missing = [str(use_id) for _, _, use_id in uses if use_id not in leading]
            if missing:
                problems.append(
                    f"messages.{uses[0][0]}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )
        elif turn.role == "user":
            previous = merged[k - 1] if k > 0 and merged[k - 1].role == "assistant" else None
            offered = (
                {b.get("id") for _, _, b in previous.items if _kind(b) == "tool_use"} if previous else set()
            )
            answered: set[Any] = set()
            for m, n, block in turn.items:
                if _kind(block) != "tool_result":
                    continue
                use_id = block.get("tool_use_id")
                if use_id not in offered or use_id in answered:
                    problems.append(
                        f"messages.{m}.content.{n}: unexpected `tool_use_id` found in `tool_result` "
                        f"blocks: {use_id}. Each `tool_result` block must have a corresponding `tool_use` "
                        "block in the previous message."
                    )
                answered.add(use_id)
    if thinking:
        problems.extend(_thinking_start(merged))
    return problems, notes


def _thinking_start(merged: list[_Merged]) -> list[str]:
    """With thinking on, the assistant message of the current tool-use turn starts with thinking."""
    last = merged[-1]
    if last.role != "user" or not any(_kind(b) == "tool_result" for _, _, b in last.items):
        return []
    assistant = next((t for t in reversed(merged[:-1]) if t.role == "assistant"), None)
    if (
        assistant is None
        or not assistant.items
        or not any(_kind(b) == "tool_use" for _, _, b in assistant.items)
    ):
        return []
    m, n, first = assistant.items[0]
    if _kind(first) in THINKING_KINDS:
        return []
    return [
        f"messages.{m}.content.{n}.type: Expected `thinking` or `redacted_thinking`, but found "
        f"`{_kind(first)}`. When `thinking` is enabled, a final `assistant` message must start with a "
        "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend "
        "you include thinking blocks from previous turns. To avoid this requirement, disable `thinking`. "
        f"Please consult our documentation at {THINKING_DOCS}"
    ]


def thinking_problems(messages: list[Any], emitted: dict[str, Emitted]) -> list[str]:
    """Thinking blocks that did not come back exactly as emitted (``emitted``: signature, or the
    data of a redacted block, to what was emitted). A block that is intact in a message that is
    not the one it was emitted in is reported once per message (at its first such block)."""
    problems: list[str] = []
    for m, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        content = blocks(message)
        altered: list[str] = []
        moved: list[str] = []
        for n, block in enumerate(content):
            kind = _kind(block)
            if kind not in THINKING_KINDS:
                continue
            key, text = (
                (block.get("signature"), block.get("thinking"))
                if kind == "thinking"
                else (block.get("data"), block.get("data"))
            )
            found = emitted.get(key) if isinstance(key, str) else None
            real = (
                f"messages.{m}.content.{n}: Invalid `signature` in `thinking` block"
                if kind == "thinking"
                else f"messages.{m}.content.{n}: Invalid `data` in `redacted_thinking` block"
            )
            if found is None:
                altered.append(f"{real} [never emitted: {str(key)[:24]!r}...]")
            elif text != found.text:
                altered.append(f"{real} [its thinking text was altered]")
            elif not moved and tuple(canonical(b) for b in content) != found.message:
                moved.append(
                    f"{real} [its message is not the one it was emitted in: {[_kind(b) for b in content]} "
                    f"now, {[c[0] if isinstance(c, tuple) else '?' for c in found.message]} emitted]"
                )
        problems.extend(altered or moved)
    return problems


def thinking_budget_error(body: dict[str, Any], headers: dict[str, str]) -> str | None:
    """The real API's checks of ``thinking.budget_tokens``: at least 1024, and below ``max_tokens``
    unless interleaved thinking (a beta Claude Code sends) lets it exceed them."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int):
        return "thinking.enabled.budget_tokens: Field required"
    if budget < 1024:
        return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
    interleaved = "interleaved-thinking" in headers.get("anthropic-beta", "")
    if not interleaved and budget >= body["max_tokens"]:
        return (
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
            f"{THINKING_DOCS}#max-tokens-and-context-window-size"
        )
    return None


def real_message(problem: str) -> str:
    """A recorded problem as the API words it (without the bracketed detail)."""
    return problem.split(" [", 1)[0]


def read_call_ids(messages: list[Any]) -> set[str]:
    return {
        str(b.get("id"))
        for message in messages
        for b in blocks(message)
        if _kind(b) == "tool_use" and b.get("name") == READ_TOOL
    }


def is_read_follow_up(messages: list[Any], emitted_reads: set[str] | frozenset[str] = frozenset()) -> bool:
    """The request ends with a user message answering a ``read_tool_output`` call (one the fake
    emitted, or one in ``messages``): the proxy asks again after answering a read."""
    if not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") != "user":
        return False
    reads = set(emitted_reads) | read_call_ids(messages)
    return any(_kind(b) == "tool_result" and b.get("tool_use_id") in reads for b in blocks(messages[-1]))


def leaks(messages: list[Any], follow_up: bool, emitted_reads: set[str] | frozenset[str]) -> list[str]:
    """``read_tool_output`` calls or results in a request that is not a read follow-up round,
    other than the rounds the model really had: a proxy puts its read rounds back where they
    happened (calls this fake emitted, each answered), and only a call it never emitted, or a
    result without its call, came from elsewhere (a client that saw the proxy's tool)."""
    if follow_up:
        return []
    calls = read_call_ids(messages)
    found: list[str] = []
    for m, message in enumerate(messages):
        for n, block in enumerate(blocks(message)):
            if (
                _kind(block) == "tool_use"
                and block.get("name") == READ_TOOL
                and block.get("id") not in emitted_reads
            ):
                found.append(f"messages.{m}.content.{n}: a read_tool_output tool_use the model never made")
            elif (
                _kind(block) == "tool_result"
                and block.get("tool_use_id") in emitted_reads
                and block.get("tool_use_id") not in calls
            ):
                found.append(f"messages.{m}.content.{n}: a read_tool_output tool_result without its call")
    return found


def handles(body: dict[str, Any]) -> list[str]:
    """Saved-output handles named in the system prompt or the messages, in order, once each."""
    text = orjson.dumps([body.get("system"), body.get("messages")], default=str).decode()
    return list(dict.fromkeys(HANDLE.findall(text)))


def text_of(message: Any) -> str:
    return "".join(
        b.get("text", "") for b in blocks(message) if _kind(b) == "text" and isinstance(b.get("text"), str)
    )
