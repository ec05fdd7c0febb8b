"""Usage figures as providers report them: integer fields read safely (a boolean or a string
is not a count), one round's usage added to a read loop's total, and an answer's ``usage``."""

from __future__ import annotations

from typing import Any

import orjson


def int_field(data: Any, key: str) -> int:
    """``data[key]`` when it is a JSON integer (not a boolean), else 0."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def add_round_usage(
    total: dict[str, int], usage: dict[str, Any], prompt: str, output: str, whole: str
) -> None:
    """One more round into ``total``: its prompt figure replaces the last one, its output adds."""
    value = usage.get(prompt)
    if isinstance(value, int) and not isinstance(value, bool):
        total[prompt] = value
    value = usage.get(output)
    if isinstance(value, int) and not isinstance(value, bool):
        total[output] = total.get(output, 0) + value
    total[whole] = total.get(prompt, 0) + total.get(output, 0)


def json_usage(raw: bytes) -> Any:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data.get("usage") if isinstance(data, dict) else None


def int_path(mapping: Any, path: tuple[str, ...]) -> int:
    """An integer field nested in ``mapping`` (0 when absent)."""
    node = mapping
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, int) and not isinstance(node, bool) else 0
