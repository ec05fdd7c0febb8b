"""mini-swe-agent: its ``DefaultAgent`` with the package's own configs (``mini.yaml`` for
tool calls, ``mini_textbased.yaml`` for text actions), a litellm model pointed at the proxy,
and a ``LocalEnvironment`` that really runs the commands in ``workdir``. Never interactive.

The caller sets ``MSWEA_SILENT_STARTUP``, ``MSWEA_GLOBAL_CONFIG_DIR`` (read at import) and
``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT`` in the environment first."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from tests.e2e.clients import API_KEY, MODEL, ClientRun, steps_in

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TEXT_FENCE = "mswea_bash_command"


def run(
    base_url: str,
    task: str,
    *,
    mode: Literal["text", "toolcall"],
    workdir: Path,
    headers: dict[str, str],
    timeout: float = 30.0,
    wall_time: int = 90,
) -> ClientRun:
    import litellm
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import get_config_from_spec
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_model import LitellmModel
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    litellm.suppress_debug_info = True
    config = get_config_from_spec("mini_textbased.yaml" if mode == "text" else "mini.yaml")
    model_config: dict[str, Any] = {
        **config["model"],
        "model_name": f"openai/{MODEL}",
        "cost_tracking": "ignore_errors",
    }
    model_config["model_kwargs"] = {
        **model_config.get("model_kwargs", {}),
        "api_base": base_url,
        "api_key": API_KEY,
        "timeout": timeout,
        "max_retries": 0,
        "extra_headers": headers,
    }
    model = (
        LitellmTextbasedModel(**model_config)  # type: ignore[no-untyped-call]
        if mode == "text"
        else LitellmModel(**model_config)
    )
    environment = LocalEnvironment(
        cwd=str(workdir), timeout=20, env=config.get("environment", {}).get("env", {})
    )
    agent_config = {k: v for k, v in config["agent"].items() if k in ("system_template", "instance_template")}
    agent = DefaultAgent(
        model, environment, **agent_config, step_limit=0, cost_limit=0, wall_time_limit_seconds=wall_time
    )
    result = agent.run(task)
    outputs = [
        str((m.get("extra") or {}).get("raw_output", ""))
        for m in agent.messages
        if m.get("role") in ("tool", "user")
    ]
    return ClientRun(
        final=str(result.get("submission", "")),
        tool_steps=[step for output in outputs for step in steps_in(output)],
        history={"exit_status": result.get("exit_status"), "messages": agent.messages},
    )
