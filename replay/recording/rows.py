"""Rows in the shape of ``nebius/SWE-rebench-openhands-trajectories`` (its parquet export).

Every message carries all five keys (``content, name, role, tool_call_id, tool_calls``) with
null where a key does not apply, and every tool schema's ``parameters.properties`` is padded
with the property names of all the other tools, set to null. These helpers undo the padding.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson


def iter_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    with Path(path).open("rb") as handle:
        for line in handle:
            if line.strip():
                yield orjson.loads(line)


def clean_message(message: dict[str, Any]) -> dict[str, Any]:
    """Drop keys that are null padding; keep everything else as recorded."""
    return {key: value for key, value in message.items() if value is not None}


def clean_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """Restore a tool schema's own parameters: padded properties are null."""
    tool = dict(tool)
    function = dict(tool.get("function") or {})
    parameters = dict(function.get("parameters") or {})
    properties = parameters.get("properties")
    if isinstance(properties, dict):
        parameters["properties"] = {k: v for k, v in properties.items() if v is not None}
        required = parameters.get("required")
        if isinstance(required, list):
            parameters["required"] = [r for r in required if r in parameters["properties"]]
    function = {k: v for k, v in function.items() if v is not None}
    if parameters:
        function["parameters"] = {k: v for k, v in parameters.items() if v is not None}
    tool["function"] = function
    return {k: v for k, v in tool.items() if v is not None}


def row_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [clean_message(m) for m in row.get("trajectory") or []]


def row_tools(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [clean_tool(t) for t in row.get("tools") or []]
