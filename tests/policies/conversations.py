"""Hypothesis strategies for chat histories: turns, parallel tool calls, text-only agents,
content as parts, retries, and an optional in-flight final exchange."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

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
def conversation(draw: st.DrawFn) -> list[dict[str, Any]]:
    counter = iter(range(10_000))
    messages: list[dict[str, Any]] = [{"role": "system", "content": draw(text(50))}]
    text_agent = draw(st.booleans()) and draw(st.booleans())
    for _ in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(content(80))})
        for _ in range(draw(st.integers(0, 12))):
            if text_agent:
                messages.append({"role": "assistant", "content": "```bash\nls\n```"})
                messages.append({"role": "user", "content": draw(content(600))})
                continue
            if draw(st.integers(0, 4)) == 0:
                messages.append({"role": "assistant", "content": draw(text(40))})
                continue
            ids = [f"call_{next(counter)}" for _ in range(draw(st.integers(1, 3)))]
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'},
                        }
                        for i in ids
                    ],
                }
            )
            results = [
                {"role": "tool", "tool_call_id": i, "name": "execute_bash", "content": draw(content(600))}
                for i in ids
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
