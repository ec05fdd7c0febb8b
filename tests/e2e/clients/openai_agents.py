"""The OpenAI Agents SDK (``openai-agents``) on the Chat Completions API, through the proxy."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.agent_upstream import step_output
from tests.e2e.clients import API_KEY, MODEL, ClientRun


async def _run(
    base_url: str, task: str, *, stream: bool, max_turns: int, timeout: float, headers: dict[str, str]
) -> ClientRun:
    import openai
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    ran: list[int] = []

    @function_tool
    def run_check(step: int) -> str:
        """Run the scripted check number `step` and return its full log."""
        ran.append(step)
        return step_output(step)

    client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=timeout)
    agent = Agent(
        name="checker",
        instructions="You run checks with run_check, one per turn, then report.",
        tools=[run_check],
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(include_usage=True, extra_headers=headers),
    )
    try:
        if stream:
            result: Any = Runner.run_streamed(agent, task, max_turns=max_turns)
            events = 0
            async for _event in result.stream_events():
                events += 1
            assert events > 0
        else:
            result = await Runner.run(agent, task, max_turns=max_turns)
    finally:
        await client.close()
    return ClientRun(final=str(result.final_output), tool_steps=ran, history=result.to_input_list())


def run(
    base_url: str,
    task: str,
    *,
    stream: bool,
    max_turns: int,
    headers: dict[str, str],
    timeout: float = 60.0,
) -> ClientRun:
    return asyncio.run(
        asyncio.wait_for(
            _run(base_url, task, stream=stream, max_turns=max_turns, timeout=timeout / 2, headers=headers),
            timeout,
        )
    )
