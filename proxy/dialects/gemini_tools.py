"""Gemini tools: ``tools[].functionDeclarations`` read as Chat Completions function tools, and
``read_tool_output`` declared and withdrawn.

The read tool joins the client's first ``functionDeclarations`` list (a second tool object
beside a search tool is refused by some models), its schema in the field the client's own
declarations use (``parametersJsonSchema``, Gemini CLI's, else ``parameters``). With
``toolConfig`` in ``ANY`` or ``VALIDATED`` mode and a list of allowed functions, it is allowed
too. Withdrawn for a last round, it goes with its declaration; when it was the only function,
it stays declared and ``functionCallingConfig.mode`` is ``NONE`` (the history holds its calls).
"""

from __future__ import annotations

import functools
from typing import Any

from proxy.dialects.gemini_contents import field, key_of
from proxy.read_tool.tool import TOOL_NAME, tool_schema

_SCHEMA_FIELDS = ("parametersJsonSchema", "parameters_json_schema", "parameters")


def _declarations(tool: Any) -> list[Any] | None:
    found = field(tool, "functionDeclarations") if isinstance(tool, dict) else None
    return found if isinstance(found, list) else None


def neutral_tools(tools: Any) -> list[Any]:
    """Function declarations as Chat Completions declares them (counted the same through every
    door); other tools (``googleSearch``, ``codeExecution``...) as they are."""
    neutral: list[Any] = []
    for tool in tools if isinstance(tools, list) else []:
        declarations = _declarations(tool)
        if declarations is None:
            neutral.append(tool)
            continue
        for declaration in declarations:
            if not isinstance(declaration, dict):
                continue
            schema = next((declaration[k] for k in _SCHEMA_FIELDS if k in declaration), None)
            function = {"name": declaration.get("name"), "description": declaration.get("description", "")}
            if schema is not None:
                function["parameters"] = schema
            neutral.append({"type": "function", "function": function})
    return neutral


@functools.lru_cache(maxsize=32)
def read_declaration(max_lines: int, schema_field: str) -> dict[str, Any]:
    """The read tool as a function declaration: one object per setting (``tool_schema``)."""
    function = tool_schema(max_lines)["function"]
    return {"name": TOOL_NAME, "description": function["description"], schema_field: function["parameters"]}


def _schema_field(tools: list[Any]) -> str:
    for tool in tools:
        for declaration in _declarations(tool) or []:
            if isinstance(declaration, dict):
                return next((k for k in _SCHEMA_FIELDS if k in declaration), "parameters")
    return "parameters"


def with_read_tool(body: dict[str, Any], max_lines: int) -> dict[str, Any]:
    raw = field(body, "tools") if isinstance(field(body, "tools"), list) else []
    tools: list[Any] = list(raw)
    declaration = read_declaration(max_lines, _schema_field(tools))
    at = next((i for i, t in enumerate(tools) if _declarations(t) is not None), None)
    if at is None:
        tools.append({"functionDeclarations": [declaration]})
    else:
        key = key_of(tools[at], "functionDeclarations")
        tools[at] = {**tools[at], key: [*tools[at][key], declaration]}
    result = {**body, key_of(body, "tools"): tools}
    config = field(body, "toolConfig")
    calling = field(config, "functionCallingConfig") if isinstance(config, dict) else None
    allowed = field(calling, "allowedFunctionNames") if isinstance(calling, dict) else None
    if isinstance(allowed, list) and TOOL_NAME not in allowed:
        assert isinstance(config, dict) and isinstance(calling, dict)
        calling = {**calling, key_of(calling, "allowedFunctionNames"): [*allowed, TOOL_NAME]}
        result[key_of(body, "toolConfig")] = {**config, key_of(config, "functionCallingConfig"): calling}
    return result


def without_read_tool(body: dict[str, Any]) -> dict[str, Any]:
    tools = field(body, "tools") if isinstance(field(body, "tools"), list) else []
    kept: list[Any] = []
    others = 0
    for tool in tools:
        declarations = _declarations(tool)
        if declarations is None:
            kept.append(tool)
            continue
        left = [d for d in declarations if not (isinstance(d, dict) and d.get("name") == TOOL_NAME)]
        others += len(left)
        if left:
            kept.append({**tool, key_of(tool, "functionDeclarations"): left})
    if others:
        result = {**body, key_of(body, "tools"): kept}
        config = field(body, "toolConfig")
        calling = field(config, "functionCallingConfig") if isinstance(config, dict) else None
        allowed = field(calling, "allowedFunctionNames") if isinstance(calling, dict) else None
        if isinstance(allowed, list) and TOOL_NAME in allowed:
            assert isinstance(config, dict) and isinstance(calling, dict)
            names = [n for n in allowed if n != TOOL_NAME]
            calling = {**calling, key_of(calling, "allowedFunctionNames"): names}
            result[key_of(body, "toolConfig")] = {**config, key_of(config, "functionCallingConfig"): calling}
        return result
    # Only the read tool: the history holds its calls, so it stays declared and may not be called.
    config = field(body, "toolConfig")
    config = config if isinstance(config, dict) else {}
    none = {key_of(config, "functionCallingConfig"): {"mode": "NONE"}}
    return {**body, key_of(body, "toolConfig"): {**config, **none}}
