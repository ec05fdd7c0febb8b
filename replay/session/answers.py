"""Model arms: a question answered from an arm's view, then graded.

The answer request goes through the proxy like any agent request, so the arm's view is what
the model sees, and ``read_tool_output`` works exactly where the arm offloads (the proxy
answers it). The original sandbox is gone (a recorded run cannot be re-executed): other tool calls get a
sandbox-shutdown reply, ``think`` is acknowledged, and ``finish`` carries the final answer.

Grading keeps two verdicts side by side: a deterministic check of the exact items (paths,
counts, the exception line) and a judge model's verdict with its reasons, against the
reference extracted from the recording.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import orjson

from policies.conversation import Message, message_text
from replay.config import ModelEndpoint, ReplayConfig
from replay.session.doors import answer_message

if TYPE_CHECKING:
    from replay.questions import Question
    from replay.recording.cases import Case
    from replay.session.upstream import Ticket

AnswerRun = dict[str, Any]


class AnswerAsker(Protocol):
    """What answering a question asks of the replayer (``replay/run/replayer.py``): the run's
    configuration and one answering turn through the proxy."""

    config: ReplayConfig

    async def post_answer_request(
        self, arm: str, session: str, case: Case, messages: Sequence[Message]
    ) -> tuple[httpx.Response, Ticket]: ...


SANDBOX_SHUTDOWN = (
    "The sandbox has been shut down: commands and file operations can no longer run. "
    "Answer from what you already know."
)
THINK_ACK = "Your thought has been logged."


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    raw = (call.get("function") or {}).get("arguments")
    try:
        parsed = orjson.loads(raw) if isinstance(raw, str) else raw
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


async def answer_question(
    replayer: AnswerAsker, arm: str, case: Case, session: str, question: Question, repeat: int
) -> AnswerRun:
    """Ask one question from the arm's view; returns the answer and what it cost."""
    config = replayer.config
    messages: list[Message] = [*case.messages, {"role": "user", "content": question.prompt}]
    result: AnswerRun = {
        "answer": "",
        "turns": 0,
        "retrieval_rounds": 0,
        "model_calls": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "seconds": 0.0,
        "error": None,
    }
    for _ in range(config.max_answer_turns):
        response, ticket = await replayer.post_answer_request(arm, session, case, messages)
        result["turns"] += 1
        result["model_calls"] += ticket.model_calls
        result["prompt_tokens"] += ticket.prompt_tokens
        result["completion_tokens"] += ticket.completion_tokens
        result["seconds"] = round(result["seconds"] + ticket.model_seconds, 3)
        result["retrieval_rounds"] += int(response.headers.get("x-compaction-read-rounds", 0) or 0)
        if response.status_code != 200:
            result["error"] = f"HTTP {response.status_code}: {response.text[:300]}"
            return result
        try:
            message = answer_message(config.dialect, response.json(), config.model)
        except ValueError:
            message = None
        if message is None:
            result["error"] = "answer without a message"
            return result
        calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
        text = message_text(message).strip()
        if not calls:
            result["answer"] = text
            return result
        finish = next((c for c in calls if (c.get("function") or {}).get("name") == "finish"), None)
        if finish is not None:
            arguments = _arguments(finish)
            result["answer"] = str(arguments.get("message") or arguments.get("answer") or text)
            return result
        result["answer"] = text
        messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
        for call in calls:
            name = (call.get("function") or {}).get("name")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.get("id"),
                    "name": name,
                    "content": THINK_ACK if name == "think" else SANDBOX_SHUTDOWN,
                }
            )
    result["error"] = result["error"] or "no final answer within the turn limit"
    return result


def normalized(text: str) -> str:
    return " ".join(text.lower().split())


def exact_check(items: Sequence[str], answer: str) -> dict[str, Any]:
    """Which exact items the answer contains (whitespace- and case-insensitive)."""
    found = [item for item in items if normalized(item) in normalized(answer)]
    return {
        "items": len(items),
        "found": len(found),
        "missing": [item for item in items if item not in found],
        "correct": bool(items) and len(found) == len(items),
    }


JUDGE_PROMPT = """You grade an answer against a reference answer taken from a recorded run.

Question:
{question}

Reference answer:
{reference}

Candidate answer:
{answer}

Is the candidate answer correct with respect to the reference? Exact identifiers (paths,
counts, code, error messages) must match the reference; wording may differ. Reply with one
JSON object and nothing else: {{"correct": true or false, "reason": "one sentence"}}"""

_JSON_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)


def parse_verdict(text: str) -> tuple[bool | None, str]:
    for candidate in _JSON_OBJECT.findall(text):
        try:
            data = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        if isinstance(data, dict) and isinstance(data.get("correct"), bool):
            return data["correct"], str(data.get("reason") or "")
    lowered = text.lower()
    if "incorrect" in lowered or "not correct" in lowered or '"correct": false' in lowered:
        return False, text.strip()[:500]
    if "correct" in lowered:
        return True, text.strip()[:500]
    return None, text.strip()[:500]


async def judge_answer(
    http: httpx.AsyncClient, judge: ModelEndpoint, question: dict[str, Any], answer: str
) -> dict[str, Any]:
    """The judge model's verdict and reasons (kept for review, also when unparseable)."""
    prompt = JUDGE_PROMPT.format(
        question=question["prompt"], reference=question["reference"], answer=answer or "(no answer)"
    )
    payload = {
        "model": judge.model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0.0,
        "max_tokens": min(judge.max_tokens, 256),
    }
    try:
        response = await http.post(
            judge.base_url.rstrip("/") + "/chat/completions",
            content=orjson.dumps(payload),
            headers={"content-type": "application/json", "authorization": f"Bearer {judge.api_key()}"},
            timeout=judge.timeout,
        )
        response.raise_for_status()
        text = str(response.json()["choices"][0]["message"].get("content") or "")
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as error:
        return {"correct": None, "reason": f"judge failed: {type(error).__name__}", "judge": judge.model}
    correct, reason = parse_verdict(text)
    return {"correct": correct, "reason": reason, "judge": judge.model, "raw": text[:1000]}
