"""Hypothesis strategies for chat histories: turns, parallel tool calls, text-only agents,
content as parts, retries, edits with large arguments (files created, replaced strings, patches,
heredocs, as calls and as text actions), reads of the files they edit (an editor's view,
``Read``, ``read_file``, ``cat`` and ``sed -n`` in a shell, as calls and as text actions) and
commands run again, and an optional in-flight final exchange."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from policies.conversation import parse

WORDS = st.sampled_from(
    ["error", "passed", "failed", "def", "return", "import", "x", "foo.py", "Traceback", "42", "ok", "line\n"]
)


@st.composite
def text(draw: st.DrawFn, max_words: int = 300) -> str:
    words = draw(st.lists(WORDS, min_size=1, max_size=max_words))
    return " ".join(words)


@st.composite
def content(draw: st.DrawFn, max_words: int = 300) -> Any:
    body = draw(text(max_words))
    if draw(st.integers(0, 5)) == 0:
        return [{"type": "text", "text": body}]
    return body


@st.composite
def body(draw: st.DrawFn) -> str:
    """A file's text: up to about 2,500 tokens, cheap to draw."""
    word = draw(WORDS).strip()
    return "\n".join(f"{word}_{i} = value({i})" for i in range(draw(st.integers(0, 600))))


@st.composite
def edit_arguments(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """(tool, arguments) of an edit in one agent's schema."""
    text = draw(body())
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return "str_replace_editor", {"command": "create", "path": "/repo/new.py", "file_text": text}
    if kind == 1:
        return "str_replace_editor", {
            "command": "str_replace",
            "path": "/repo/a.py",
            "old_str": "x",
            "new_str": text,
        }
    if kind == 2:
        return "Write", {"file_path": "/w/a.py", "content": text}
    if kind == 3:
        return "MultiEdit", {
            "file_path": "/w/a.py",
            "edits": [{"old_string": text, "new_string": text + "\n#"}],
        }
    if kind == 4:
        patch = "*** Begin Patch\n*** Add File: b.py\n" + "\n".join(f"+{line}" for line in text.splitlines())
        return "apply_patch", {"input": patch + "\n*** End Patch"}
    return "execute_bash", {"command": f"cat > gen.py <<'EOF'\n{text}\nEOF\npython gen.py"}


@st.composite
def read_arguments(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """(tool, arguments) of a call that shows a file (of the paths the edits write), in one
    agent's schema: what the superseded-reads stage looks for."""
    kind = draw(st.integers(0, 4))
    if kind == 0:
        arguments: dict[str, Any] = {"command": "view", "path": "/repo/a.py"}
        if draw(st.booleans()):
            arguments["view_range"] = [1, draw(st.integers(2, 40))]
        return "str_replace_editor", arguments
    if kind == 1:
        return "Read", {"file_path": "/w/a.py"}
    if kind == 2:
        return "read_file", {"file_path": "/w/a.py", "offset": draw(st.integers(0, 20))}
    if kind == 3:
        return "execute_bash", {"command": "cat /repo/new.py"}
    return "shell", {"command": ["bash", "-lc", "sed -n 1,40p /repo/a.py"]}


def edit_function(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"name": tool, "arguments": json.dumps(arguments)}


@st.composite
def text_edit(draw: st.DrawFn) -> str:
    text = draw(body())
    return (
        "<function=str_replace_editor>\n<parameter=command>create</parameter>\n"
        f"<parameter=path>/testbed/x.py</parameter>\n<parameter=file_text>\n{text}\n</parameter>\n</function>"
    )


@st.composite
def conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    counter = iter(range(10_000))
    messages: list[dict[str, Any]] = [{"role": "system", "content": draw(text(50))}]
    text_agent = draw(st.booleans()) and draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(content(80))})
        for _ in range(draw(st.integers(0, 12))):
            if text_agent:
                kind = draw(st.integers(0, 3))
                action = (
                    draw(text_edit())
                    if kind == 0
                    else "```bash\ncat /testbed/x.py\n```"
                    if kind == 1
                    else "```bash\nls\n```"
                )
                # A file's text comes back once the agent reads as one that acts in text (two
                # actions): after one action the observation reads as the last user message of a
                # chat, which a 2k window cannot keep verbatim beside a long text (the token
                # safeguard cuts it to an excerpt, as it does a long last message of any chat).
                acted = sum(1 for m in messages if m["role"] == "assistant") > 0
                observation = draw(body()) if kind == 1 and acted else draw(content(600))
                messages.append({"role": "assistant", "content": action})
                messages.append({"role": "user", "content": observation})
                continue
            if draw(st.integers(0, 4)) == 0:
                messages.append({"role": "assistant", "content": draw(text(40))})
                continue
            ids = [f"call_{next(counter)}" for _ in range(draw(st.integers(1, 3)))]
            kinds = [draw(st.integers(0, 3)) for _ in ids]
            functions = [
                edit_function(*draw(edit_arguments()))
                if kind == 0
                else edit_function(*draw(read_arguments()))
                if kind == 1
                else {"name": "execute_bash", "arguments": '{"command": "ls"}'}
                for kind in kinds
            ]
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": i, "type": "function", "function": function}
                        for i, function in zip(ids, functions, strict=True)
                    ],
                }
            )
            # A read shows a file's text, and so does a command now and then: long enough for a
            # later read or run of it to take its place.
            results = [
                {
                    "role": "tool",
                    "tool_call_id": i,
                    "name": f["name"],
                    "content": draw(body())
                    if kind == 1 or draw(st.integers(0, 3)) == 0
                    else draw(content(600)),
                }
                for i, f, kind in zip(ids, functions, kinds, strict=True)
            ]
            messages.extend(draw(st.permutations(results)))
    if draw(st.booleans()) and not text_agent:
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_final",
                        "type": "function",
                        "function": {"name": "finish", "arguments": "{}"},
                    }
                ],
            }
        )
    return messages


@st.composite
def with_instructions(
    draw: st.DrawFn, history: st.SearchStrategy[list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """``history`` with system/developer messages inside it, between steps (never between a
    call and its results): right after the task, as Claude Code sends its environment block
    for a model name it does not know, and anywhere later, a developer note mid-session."""
    messages = draw(history)
    conversation = parse(messages)
    places = [s.start for s in conversation.steps if s.start > conversation.prefix_end]
    last = conversation.steps[-1] if conversation.steps else None
    if last is not None and last.answered:
        places.append(len(messages))  # the history may end with one (Claude Code's turn 1)
    if conversation.first_user >= 0 and conversation.first_user + 1 not in places:
        places.append(conversation.first_user + 1)
    # One at a place: the Messages API wants no two messages of one role in a row.
    chosen = draw(st.lists(st.sampled_from(places), min_size=1, max_size=3, unique=True)) if places else []
    for place in sorted(chosen, reverse=True):
        role = draw(st.sampled_from(["system", "developer"]))
        messages.insert(place, {"role": role, "content": draw(content(80))})
    return messages


def tail_start(view: list[Any]) -> int:
    """Where a view's tail starts (``Conversation.tail_start``): what ``tail_offload`` may put
    behind a handle at the next request, in a tight session."""
    return parse(view).tail_start
