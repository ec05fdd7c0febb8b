"""A Gemini CLI-like agent loop against a proxy (or the fake directly): the request bodies Gemini
CLI 0.61.0 sends (``contents``, ``systemInstruction``, one ``functionDeclarations`` list with
``run_shell_command``, ``generationConfig`` with thoughts on), its history kept as it keeps it
(thought parts dropped, the text of an answer joined, each call given an id made up by the
client when the server sends none, its ``thoughtSignature`` echoed on it) and each call answered
with a ``functionResponse`` of ``{"output": ...}`` holding what the fake's command prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from tests.agent_upstream import step_output
from tests.gemini_upstream.agent import DONE_PREFIX

MODEL = "gemini-3.8-flash"
RUN_SHELL = {
    "name": "run_shell_command",
    "description": "Runs a shell command and returns its output.",
    "parametersJsonSchema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"],
    },
}
SYSTEM = "You are an interactive CLI agent. Use the tools to do the task; be brief."


@dataclass
class AgentRun:
    """What the client saw: each answer's parts as received, and its last request body."""

    answers: list[list[dict[str, Any]]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    body: dict[str, Any] = field(default_factory=dict)


def request_body(contents: list[Any]) -> dict[str, Any]:
    return {
        "contents": contents,
        "systemInstruction": {"role": "user", "parts": [{"text": SYSTEM}]},
        "tools": [{"functionDeclarations": [RUN_SHELL]}],
        "generationConfig": {
            "temperature": 1,
            "topP": 0.95,
            "topK": 64,
            "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "HIGH"},
        },
    }


def answer_parts(raw: bytes, stream: bool, code_assist: bool = False) -> list[dict[str, Any]]:
    """The parts of an answer (a stream's events' parts in order); a stream must end with one
    finish reason, as Gemini CLI checks. Code Assist's answers are unwrapped."""
    if not stream:
        data = orjson.loads(raw)
        return list((data["response"] if code_assist else data)["candidates"][0]["content"]["parts"])
    events = [
        orjson.loads(e[6:]) for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.startswith(b"data: ")
    ]
    if code_assist:
        assert all(set(e) == {"response"} for e in events), events[:1]
        events = [e["response"] for e in events]
    assert events and all("error" not in e for e in events), raw[-500:]
    reasons = [e["candidates"][0].get("finishReason") for e in events if e.get("candidates")]
    assert reasons[-1] == "STOP" and sum(1 for r in reasons if r) == 1, reasons
    return [p for e in events for p in e["candidates"][0]["content"]["parts"]]


def history_parts(parts: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """An answer as Gemini CLI keeps it: thoughts dropped, text joined, calls with an id."""
    kept: list[dict[str, Any]] = []
    text = "".join(p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought"))
    if text:
        kept.append({"text": text})
    calls = [p for p in parts if "functionCall" in p]
    for number, part in enumerate(calls):
        call = part["functionCall"]
        made = {"id": call.get("id") or f"{call['name']}_{turn}_{number}", **call}
        kept.append({**part, "functionCall": made})
    return kept


def run_agent(
    base: str,
    *,
    stream: bool,
    run: str,
    key: str,
    task: str,
    key_in_query: bool = False,
    code_assist: bool = False,
    limit: int = 60,
    lines: int = 90,
) -> AgentRun:
    """The loop until the model's final answer; ``base``: the proxy's (or the fake's) root URL.
    ``code_assist``: over Gemini CLI's Code Assist path (its envelope, a bearer token)."""
    contents: list[Any] = [
        {"role": "user", "parts": [{"text": "<session_context>linux</session_context>"}, {"text": task}]}
    ]
    seen = AgentRun()
    steps = 0
    with httpx.Client(timeout=120, trust_env=False) as http:
        for turn in range(limit):
            method = "streamGenerateContent" if stream else "generateContent"
            query = {"alt": "sse"} if stream else {}
            headers = {"content-type": "application/json", "x-agent-run": run}
            seen.body = request_body(contents)
            body: dict[str, Any] = seen.body
            url = f"{base}/v1beta/models/{MODEL}:{method}"
            if code_assist:
                url = f"{base}/v1internal:{method}"
                request = {**body, "session_id": run}
                body = {"model": MODEL, "project": "p-1", "user_prompt_id": run, "request": request}
                headers["authorization"] = f"Bearer {key}"
            elif key_in_query:
                query["key"] = key
            else:
                headers["x-goog-api-key"] = key
            response = http.post(url, params=query, headers=headers, content=orjson.dumps(body))
            assert response.status_code == 200, response.text[:2000]
            seen.raw.append(response.content)
            parts = answer_parts(response.content, stream, code_assist)
            seen.answers.append(parts)
            kept = history_parts(parts, turn)
            contents.append({"role": "model", "parts": kept})
            calls = [p["functionCall"] for p in kept if "functionCall" in p]
            if not calls:
                assert kept and kept[0]["text"].startswith(DONE_PREFIX), kept
                return seen
            answers = []
            for call in calls:
                steps += 1
                output = f"<untrusted_context>\nOutput: {step_output(steps, lines)}\n</untrusted_context>"
                answers.append(
                    {
                        "functionResponse": {
                            "id": call["id"],
                            "name": call["name"],
                            "response": {"output": output},
                        }
                    }
                )
            contents.append({"role": "user", "parts": answers})
    raise AssertionError("the run did not finish")
