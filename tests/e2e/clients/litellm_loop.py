"""LiteLLM as a client library: ``litellm.completion`` against the proxy (``openai/`` provider
with ``api_base``), the agent loop driven here. Its tool is a real shell run in ``workdir``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.e2e.clients import API_KEY, MODEL, ClientRun, steps_in

SHELL_TOOL = {
    "type": "function",
    "function": {
        "name": "run_shell",
        "description": "Run a shell command in the work directory and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command to run."}},
            "required": ["command"],
        },
    },
}


def run_shell(command: str, workdir: Path) -> str:
    done = subprocess.run(
        command, shell=True, cwd=workdir, capture_output=True, text=True, timeout=20, check=False
    )
    return f"exit code {done.returncode}\n{done.stdout}{done.stderr}"


def run(
    base_url: str,
    task: str,
    *,
    stream: bool,
    workdir: Path,
    max_turns: int,
    headers: dict[str, str],
    timeout: float = 30.0,
) -> ClientRun:
    import litellm

    litellm.suppress_debug_info = True

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent. Use run_shell for every check."},
        {"role": "user", "content": task},
    ]
    ran: list[int] = []
    for _ in range(max_turns):
        options: dict[str, Any] = {
            "model": f"openai/{MODEL}",
            "api_base": base_url,
            "api_key": API_KEY,
            "messages": messages,
            "tools": [SHELL_TOOL],
            "timeout": timeout,
            "max_retries": 0,
            "num_retries": 0,
            "extra_headers": headers,
        }
        if stream:
            chunks = list(litellm.completion(**options, stream=True, stream_options={"include_usage": True}))
            response: Any = litellm.stream_chunk_builder(chunks, messages=messages)
            assert response is not None, "the stream carried no chunks"
        else:
            response = litellm.completion(**options)
        message = response.choices[0].message
        calls = message.tool_calls or []
        if not calls:
            messages.append({"role": "assistant", "content": message.content})
            return ClientRun(final=message.content or "", tool_steps=ran, history=messages)
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments},
                    }
                    for call in calls
                ],
            }
        )
        for call in calls:
            if call.function.name != "run_shell":
                output = f"Error: unknown tool {call.function.name!r}"
            else:
                output = run_shell(json.loads(call.function.arguments)["command"], workdir)
                ran += steps_in(output)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    raise AssertionError(f"no final answer after {max_turns} turns")
