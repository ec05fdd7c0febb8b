"""The conversation model: OpenAI chat messages as turns and steps, with safe cut points.

A *step* is the unit no policy may split: an assistant message together with every tool
result that answers its calls. A plain message (user, assistant text, an observation) is a
step of its own. For agents that write actions as text, an assistant message and the
observation that follows it (sent back as a user message) form one step too, so a cut never
separates an action from what it produced.

A *turn* starts at a user message that is not such an observation.

Cutting the history *before* a step's first message is protocol-safe. The model never
rewrites messages: it indexes them, so unknown fields survive untouched.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
# The role of a neutral message that stands for an item of a wire format the policies do not
# understand (a server-side compaction item, an item reference, a web search call...): kept as
# sent and in place, never summarized, offloaded or dropped (it is always pinned).
OPAQUE_ROLE = "opaque"
# A neutral message's text that its wire format sends with it but the policies never read
# (Anthropic thinking, server tool blocks): counted in the message's tokens, shown to no
# summary, kept with its message by the dialect that wrote it.
WIRE_ONLY = "wire_only"
# Tokens a neutral message's wire form costs beyond its text (an image or a PDF in Anthropic's
# count): added to its count as they are.
WIRE_TOKENS = "wire_tokens"
# Roles of the fixed part: instructions, wherever they sit. Leading ones are the system prompt;
# one later in the history (Claude Code's environment block for a model it does not know, a
# developer note mid-session) stays verbatim at its place, never summarized, offloaded or cut.
FIXED_ROLES = frozenset({"system", "developer"})


def message_text(message: Any) -> str:
    """The textual content of a message, whatever its shape (string, parts, null)."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"] if isinstance(part, dict) and isinstance(part.get("text"), str) else str(part)
            for part in content
            if not (isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image"))
        )
    return "" if content is None else str(content)


def tool_call_ids(message: Any) -> tuple[str, ...]:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return ()
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return ()
    return tuple(c["id"] for c in calls if isinstance(c, dict) and isinstance(c.get("id"), str))


def result_id(message: Any) -> str | None:
    """The ``tool_call_id`` a tool result answers, when it is a string."""
    value = message.get("tool_call_id") if isinstance(message, dict) else None
    return value if isinstance(value, str) else None


def role(message: Any) -> str:
    value = message.get("role") if isinstance(message, dict) else None
    return value if isinstance(value, str) else ""


@dataclass(frozen=True, slots=True)
class Step:
    """Messages ``start`` to ``end`` (exclusive) that travel together."""

    start: int
    end: int
    # "system" (the fixed part: the leading system prompt, or one instruction message later in
    # the history), "user", "exchange", "assistant", "observation", "orphan", "other"
    kind: str
    call_ids: tuple[str, ...] = ()
    answered: bool = True  # every call has its result

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Conversation:
    messages: Sequence[Message]
    steps: tuple[Step, ...]
    # Leading system/developer messages: kept by every policy, outside any count.
    prefix_end: int
    # Index of the last user message that is a real question (not a text observation); -1 if none.
    last_user: int
    first_user: int
    problems: tuple[str, ...] = field(default=())
    text_actions: bool = False

    @property
    def safe_cuts(self) -> tuple[int, ...]:
        """Indices before which the history may be cut without breaking the protocol."""
        starts = [step.start for step in self.steps if step.start >= self.prefix_end]
        return (*starts, len(self.messages))

    @property
    def tail_start(self) -> int:
        """Where the tail starts: the newest step that produced output, or the newest assistant
        turn (a text action whose answer reads as an observation once a second one comes). At
        the next request only the tail may change between compaction points (``tail_offload``
        puts its output behind a handle): the prefix before it is what a prompt cache keeps."""
        kinds = ("exchange", "observation", "assistant")
        return next((s.start for s in reversed(self.steps) if s.kind in kinds), len(self.messages))


def _is_observation(messages: Sequence[Message], index: int, text_actions: bool) -> bool:
    """A user message that reports what the previous text action produced."""
    if not text_actions or index == 0:
        return False
    previous = messages[index - 1]
    return role(previous) == "assistant" and not tool_call_ids(previous)


# How text-action agents write an action: a fenced command block (SWE-agent), a
# ``<function=...>`` block (SWE-agent with function-calling prompts, OpenHands' text mode), or
# smolagents' ToolCallingAgent, whose calls come back as assistant text ``Calling tools:\n[...]``.
_TEXT_ACTION = re.compile(r"```|<function=|^Calling tools:", re.MULTILINE)
# How such agents label what an action produced when they send it back as a user message:
# smolagents (``Observation:``, ``Call id: call_1\nObservation:`` or ``...\nError:``),
# SWE-agent's ``OBSERVATION:``, CodeAgent's ``Execution logs:``, and plain ``Tool result:``.
OBSERVATION_LABEL = re.compile(
    r"^\s*(?:Call id: *\S+\s*\n\s*)?(?:Observation|OBSERVATION|Execution logs|Tool (?:result|output|response)"
    r"|Output)s?\s*:|^\s*Call id: *\S+\s*\n\s*Error\s*:"
)


def is_labelled_observation(message: Any) -> bool:
    """A user message whose text starts with an observation label (``Observation:``...)."""
    return role(message) == "user" and bool(OBSERVATION_LABEL.match(message_text(message)[:200]))


# An assistant's acknowledgement of context a harness supplied as a user message (aider: "Ok.",
# "Ok, I won't try and edit those files without asking first.", "Ok, any changes I propose will
# be to those files."). Such a pair is context, not a turn of the task.
_ACKNOWLEDGEMENT = re.compile(r"^\s*ok\b[.,!]?", re.IGNORECASE)
_ACKNOWLEDGEMENT_CHARS = 300


def is_acknowledgement(message: Any) -> bool:
    """A short plain assistant reply that only acknowledges (``Ok.``, ``Ok, ...``)."""
    if role(message) != "assistant" or tool_call_ids(message):
        return False
    text = message_text(message)
    return len(text) <= _ACKNOWLEDGEMENT_CHARS and bool(_ACKNOWLEDGEMENT.match(text))


def _uses_text_actions(messages: Sequence[Message]) -> bool:
    """Agents that write actions as text never send tool calls or tool results, write
    actions in their messages (or label what their actions produced), and answer their own
    actions with user messages (observations). A plain multi-turn chat is not such an agent."""
    if any(role(m) == "tool" or tool_call_ids(m) for m in messages):
        return False
    answers = [
        i
        for i in range(1, len(messages))
        if role(messages[i]) == "user" and role(messages[i - 1]) == "assistant"
    ]
    if len(answers) < 2:
        return False
    if sum(1 for i in answers if is_labelled_observation(messages[i])) >= 2:
        return True
    if any(is_acknowledgement(m) for m in messages):
        # A harness that feeds context as acknowledged user messages (aider) is a chat with a
        # person, whose fenced blocks are edits, not actions answered by observations.
        return False
    return any(role(m) == "assistant" and _TEXT_ACTION.search(message_text(m)) for m in messages)


_PREAMBLE = re.compile(r"^<([A-Za-z_][\w-]*)>.*</\1>$", re.DOTALL)


def is_harness_preamble(message: Any) -> bool:
    """A user message an agent harness sends before the task, wholly one tagged block (Codex
    CLI's ``<environment_context>...</environment_context>``, ``<user_instructions>``...)."""
    return bool(_PREAMBLE.match(message_text(message).strip()))


def system_prefix_end(messages: Sequence[Message]) -> int:
    """How many leading system/developer messages there are (without parsing the rest)."""
    return after_fixed(messages, 0)


def after_fixed(messages: Sequence[Message], index: int) -> int:
    """The first index at or after ``index`` that is not a system/developer message: a run of
    instructions right after a kept message (the task) is kept with it, before any summary."""
    while index < len(messages) and role(messages[index]) in FIXED_ROLES:
        index += 1
    return index


def parse(messages: Sequence[Message]) -> Conversation:
    problems: list[str] = []
    count = len(messages)
    prefix_end = system_prefix_end(messages)
    text_actions = _uses_text_actions(messages)
    steps: list[Step] = [Step(0, prefix_end, "system")] if prefix_end else []
    index = prefix_end
    last_user = -1
    first_user = -1
    preamble_only = False  # every user message so far is a harness preamble
    # The last user message was answered by an acknowledgement before any tool work: it was
    # context (aider's few-shot switch, repo map, file contents), and the task is still to come.
    context_pair = False
    worked = False  # a tool exchange or an observation has happened
    while index < count:
        message = messages[index]
        kind = role(message)
        calls = tool_call_ids(message)
        if calls:
            pending = set(calls)
            end = index + 1
            while end < count and role(messages[end]) == "tool" and result_id(messages[end]) in pending:
                pending.discard(result_id(messages[end]) or "")
                end += 1
            answered = not pending
            if not answered and end < count:
                problems.append(f"message {index}: tool calls without results: {sorted(pending)}")
            steps.append(Step(index, end, "exchange", calls, answered))
            worked = True
            index = end
            continue
        if kind == "tool":
            problems.append(f"message {index}: tool result {message.get('tool_call_id')!r} without its call")
            steps.append(Step(index, index + 1, "orphan"))
        elif kind == "user":
            if _is_observation(messages, index, text_actions) and steps and steps[-1].kind == "assistant":
                previous = steps.pop()
                steps.append(Step(previous.start, index + 1, "observation"))
                worked = True
            else:
                steps.append(Step(index, index + 1, "user"))
                last_user = index
                if first_user < 0 or context_pair or (preamble_only and not is_harness_preamble(message)):
                    # The task: the first user message that is not an agent harness's preamble
                    # nor context it had acknowledged.
                    preamble_only = is_harness_preamble(message)
                    first_user = index
                context_pair = False
        elif kind == "assistant":
            steps.append(Step(index, index + 1, "assistant"))
            if not worked and index - 1 == last_user >= 0 and is_acknowledgement(message):
                context_pair = True
        elif kind in FIXED_ROLES:
            steps.append(Step(index, index + 1, "system"))  # part of the fixed part, in place
        else:
            steps.append(Step(index, index + 1, "other"))
        index += 1
    return Conversation(
        messages=messages,
        steps=tuple(steps),
        prefix_end=prefix_end,
        last_user=last_user,
        first_user=first_user,
        problems=tuple(problems),
        text_actions=text_actions,
    )


_CONTENT_PART_TEXT_TYPES = frozenset({"text", "input_text", "output_text"})


def _part_problem(part: Any) -> str | None:
    """What is wrong with a content part, as a path below it (``.text must be a string``)."""
    if isinstance(part, str):
        return None
    if not isinstance(part, dict):
        return " must be an object"
    kind = part.get("type")
    if kind is not None and not isinstance(kind, str):
        return ".type must be a string"
    if kind in _CONTENT_PART_TEXT_TYPES and not isinstance(part.get("text"), str):
        return ".text must be a string"
    return None


def _call_problem(call: Any) -> str | None:
    if not isinstance(call, dict):
        return " must be an object"
    if not isinstance(call.get("id"), str):
        return ".id must be a string"
    if call.get("type") == "custom":
        # A custom tool's call (GPT-5's free-form tools): its name and its free-text input.
        custom = call.get("custom")
        if not isinstance(custom, dict):
            return ".custom must be an object"
        if not isinstance(custom.get("name"), str):
            return ".custom.name must be a string"
        if not isinstance(custom.get("input"), str):
            return ".custom.input must be a string"
        return None
    function = call.get("function")
    if not isinstance(function, dict):
        return ".function must be an object"
    if not isinstance(function.get("name"), str):
        return ".function.name must be a string"
    if not isinstance(function.get("arguments", ""), str):
        return ".function.arguments must be a string"
    return None


def _message_problem(message: Any) -> str | None:
    """What is wrong with one message, as a path below it; the path is only written for a
    message that has a problem (every request checks each of its messages)."""
    if not isinstance(message, dict):
        return " must be an object"
    if not isinstance(message.get("role"), str):
        return ".role must be a string"
    content = message.get("content")
    if isinstance(content, list):
        for position, part in enumerate(content):
            problem = _part_problem(part)
            if problem:
                return f".content[{position}]{problem}"
    elif content is not None and not isinstance(content, str):
        return ".content must be a string, an array of parts or null"
    for key in ("name", "tool_call_id"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            return f".{key} must be a string"
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            return ".tool_calls must be an array"
        for position, call in enumerate(calls):
            problem = _call_problem(call)
            if problem:
                return f".tool_calls[{position}]{problem}"
    return None


def shape_problem(messages: Sequence[Any], start: int = 0) -> str | None:
    """The first field of a chat history with a type no API accepts (``messages[3].tool_call_id
    must be a string``), or None. Such a request is never compacted: it goes upstream as the
    client sent it, and the upstream's own error answers it. The messages before ``start``
    are known to have none (each message is checked on its own)."""
    for index in range(start, len(messages)):
        problem = _message_problem(messages[index])
        if problem:
            return f"messages[{index}]{problem}"
    return None
