"""langchain-openai: ``ChatOpenAI(base_url=proxy).bind_tools([...])``, the agent loop driven
here with ``invoke`` or ``stream`` (chunks aggregated)."""

from __future__ import annotations

from typing import Any

from tests.agent_upstream import step_output
from tests.e2e.clients import API_KEY, MODEL, ClientRun


def run(
    base_url: str, task: str, *, stream: bool, max_turns: int, headers: dict[str, str], timeout: float = 30.0
) -> ClientRun:
    from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    ran: list[int] = []

    @tool
    def fetch_log(step: int) -> str:
        """Fetch the full log of check number `step`."""
        ran.append(step)
        return step_output(step)

    model = ChatOpenAI(
        model=MODEL,
        base_url=base_url,
        api_key=API_KEY,  # type: ignore[arg-type]
        max_retries=0,
        timeout=timeout,
        stream_usage=True,
        default_headers=headers,
    ).bind_tools([fetch_log])
    messages: list[BaseMessage] = [
        SystemMessage("You are a careful agent. Fetch every log with fetch_log."),
        HumanMessage(task),
    ]
    for _ in range(max_turns):
        answer: Any
        if stream:
            answer = None
            for chunk in model.stream(messages):
                answer = chunk if answer is None else answer + chunk
            assert answer is not None, "the stream carried no chunks"
        else:
            answer = model.invoke(messages)
        messages.append(answer)
        if not answer.tool_calls:
            history = [m.model_dump() for m in messages]
            return ClientRun(final=str(answer.content), tool_steps=ran, history=history)
        for call in answer.tool_calls:
            if call["name"] != "fetch_log":
                messages.append(ToolMessage(f"Error: unknown tool {call['name']!r}", tool_call_id=call["id"]))
                continue
            messages.append(fetch_log.invoke(call))
    raise AssertionError(f"no final answer after {max_turns} turns")
