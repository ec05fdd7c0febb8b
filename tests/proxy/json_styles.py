"""The JSON layouts clients send (orjson's compact one, Python's spaced, indented and ASCII
escaped), for tests of what the proxy reads from and copies out of a body's bytes."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import strategies as st

STYLES = st.sampled_from(["orjson", "spaced", "indented", "ascii"])


def dump(value: Any, style: str) -> bytes:
    if style == "orjson":
        return orjson.dumps(value)
    if style == "spaced":
        return json.dumps(value, ensure_ascii=False).encode()
    if style == "indented":
        return json.dumps(value, indent=1, ensure_ascii=False).encode()
    return json.dumps(value).encode()
