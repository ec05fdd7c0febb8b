"""Evidence survival: visible, recoverable through a handle the view names, or lost."""

from __future__ import annotations

import orjson

from policies.handles import new_handle as content_handle
from policies.handles import placeholder_text
from replay.session.survival import handles_in, merge_counts, survival, survival_counts, view_text

OUTPUT = "collected 3 items\n\n=== 1 failed, 2 passed in 0.12s ==="
HANDLE = content_handle(OUTPUT)


def view_with_output(content: str) -> list[dict[str, object]]:
    arguments = orjson.dumps({"command": "pytest -q tests/test_a.py"}).decode()
    return [
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "execute_bash", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": content},
    ]


def never(handle: str) -> str | None:
    raise AssertionError("no read expected")


def test_visible_when_every_evidence_string_is_in_the_view() -> None:
    state, missing = survival(["1 failed, 2 passed"], view_with_output(OUTPUT), never)
    assert (state, missing) == ("visible", [])


def test_call_arguments_are_searched_as_parsed_values() -> None:
    # JSON escaping in the wire form must not hide an argument value.
    assert survival(["pytest -q tests/test_a.py"], view_with_output(""), never)[0] == "visible"
    assert "pytest -q tests/test_a.py" in view_text(view_with_output(""))


def test_recoverable_when_the_rest_sits_in_an_output_the_view_names() -> None:
    view = view_with_output(placeholder_text(HANDLE, "execute_bash pytest, 3 lines"))
    assert handles_in(view_text(view)) == [HANDLE]
    saved = {HANDLE: OUTPUT}
    state, missing = survival(["1 failed, 2 passed", "Fix it."], view, saved.get)
    assert (state, missing) == ("recoverable", [])


def test_lost_when_the_handle_is_unknown_or_absent() -> None:
    view = view_with_output(placeholder_text(HANDLE, "execute_bash pytest"))
    assert survival(["1 failed, 2 passed"], view, {}.get) == ("lost", ["1 failed, 2 passed"])
    assert survival(["1 failed, 2 passed"], view_with_output("cleared"), {HANDLE: OUTPUT}.get)[0] == "lost"


def test_a_saved_output_the_view_does_not_name_does_not_count() -> None:
    other = content_handle("something else")
    view = view_with_output(placeholder_text(other, "x"))
    assert survival(["1 failed"], view, {other: "something else", HANDLE: OUTPUT}.get)[0] == "lost"


def test_counts() -> None:
    counts = survival_counts(["visible", "lost", "visible"])
    assert counts == {"visible": 2, "recoverable": 0, "lost": 1}
    assert merge_counts([counts, {"recoverable": 1}]) == {"visible": 2, "recoverable": 1, "lost": 1}
