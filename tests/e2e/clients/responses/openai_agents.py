"""The OpenAI Agents SDK's default model (``OpenAIResponsesModel``) on the Responses API:
``Runner.run`` or ``Runner.run_streamed``, with the SDK's default client set to one at the proxy
for the run and restored after it."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.e2e.clients.responses import API_KEY, CLIENT_TIMEOUT, INSTRUCTIONS, MODEL, ClientRun
from tests.responses_upstream import step_output


async def _run(
    base_url: str, task: str, *, stream: bool, headers: dict[str, str], max_turns: int
) -> ClientRun:
    import openai
    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_api,
        set_default_openai_client,
        set_tracing_disabled,
    )
    from agents.models import _openai_shared

    set_tracing_disabled(True)
    ran: list[int] = []

    @function_tool
    def run_check(step: int) -> str:
        """Run the scripted check number `step` and return its full log."""
        ran.append(step)
        return step_output(step)

    previous_client = _openai_shared.get_default_openai_client()
    previous_api = _openai_shared.get_use_responses_by_default()
    client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=CLIENT_TIMEOUT / 2)
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("responses")
    agent = Agent(
        name="checker",
        instructions=INSTRUCTIONS,
        tools=[run_check],
        model=MODEL,
        model_settings=ModelSettings(extra_headers=headers),
    )
    kinds: set[str] = set()
    try:
        if stream:
            result: Any = Runner.run_streamed(agent, task, max_turns=max_turns)
            async for event in result.stream_events():
                if event.type == "raw_response_event":
                    kinds.add(str(event.data.type))
            assert kinds, "no raw response events"
        else:
            result = await Runner.run(agent, task, max_turns=max_turns)
        model_names = sorted({type(r).__name__ for r in result.raw_responses})
    finally:
        await client.close()
        _openai_shared.set_default_openai_client(previous_client)  # type: ignore[arg-type]
        _openai_shared.set_use_responses_by_default(previous_api)
    return ClientRun(
        final=str(result.final_output),
        tool_steps=ran,
        history=result.to_input_list(),
        notes={"event_types": sorted(kinds), "responses": model_names, "turns": len(result.raw_responses)},
    )


def run(base_url: str, task: str, *, stream: bool, headers: dict[str, str], max_turns: int) -> ClientRun:
    return asyncio.run(
        asyncio.wait_for(
            _run(base_url, task, stream=stream, headers=headers, max_turns=max_turns), CLIENT_TIMEOUT
        )
    )
