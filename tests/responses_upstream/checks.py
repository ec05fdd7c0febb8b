"""What the fake Responses model checks in every ``input``, the way the real server does (the
call/output protocol, reasoning items followed by their turn), and what it checks for the
tests: reasoning items come back as emitted, and no ``read_tool_output`` item reaches a request
the client made."""

from __future__ import annotations

from typing import Any

from tests.responses_upstream.protocol import CALLS, MODEL_ITEMS, OUTPUTS, READ_TOOL, item_kind


def protocol_problems(items: list[Any]) -> list[str]:
    """Protocol problems of a Responses ``input``, as the real server refuses them."""
    problems: list[str] = []
    calls: dict[str, tuple[int, str]] = {}  # call_id -> (position, type)
    answered: set[str] = set()
    for position, item in enumerate(items):
        kind = item_kind(item)
        if kind is None:
            problems.append(f"input[{position}] is not an object")
            continue
        assert isinstance(item, dict)
        if kind in CALLS:
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                problems.append(f"input[{position}]: a {kind} without a call_id")
                continue
            if call_id in calls:
                problems.append(f"input[{position}]: call_id {call_id!r} used twice")
            calls[call_id] = (position, kind)
        elif kind in OUTPUTS:
            call_id = item.get("call_id")
            call = calls.get(call_id) if isinstance(call_id, str) else None
            if call is None:
                problems.append(f"input[{position}]: No tool call found for {kind} with call_id {call_id!r}")
            elif call[1] != OUTPUTS[kind]:
                problems.append(f"input[{position}]: {kind} answers a {call[1]} ({call_id!r})")
            elif call_id in answered:
                problems.append(f"input[{position}]: {kind} for {call_id!r} answered twice")
            else:
                answered.add(call_id)  # type: ignore[arg-type]
        elif kind == "reasoning" or _references_reasoning(item):
            following = items[position + 1] if position + 1 < len(items) else None
            next_kind = item_kind(following)
            # What follows a reasoning reference must be its turn's item, itself or by reference.
            follows_reference = next_kind == "item_reference" and not _references_reasoning(following)
            is_model_item = (next_kind in MODEL_ITEMS or follows_reference) and not (
                next_kind == "message"
                and isinstance(following, dict)
                and following.get("role") != "assistant"
            )
            if not is_model_item:
                where = (
                    "last" if following is None else f"followed by {next_kind} {following.get('role', '')}"
                )
                problems.append(
                    f"input[{position}]: Item {item.get('id')!r} of type 'reasoning' was provided without "
                    f"its required following item ({where.strip()})"
                )
    for call_id, (position, kind) in calls.items():
        if call_id not in answered:
            problems.append(f"input[{position}]: No tool output found for {kind} call {call_id!r}")
    return problems


def _references_reasoning(item: Any) -> bool:
    """An ``item_reference`` to a stored reasoning item (OpenAI's reasoning ids start ``rs_``):
    the server reads it as that reasoning item, with the same rule on what follows it."""
    return (
        isinstance(item, dict)
        and item.get("type") == "item_reference"
        and str(item.get("id", "")).startswith("rs_")
    )


def is_read(item: Any) -> bool:
    return isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") == READ_TOOL


def read_call_ids(items: list[Any]) -> set[str]:
    return {
        str(i.get("call_id"))
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call" and i.get("name") == READ_TOOL
    }


def is_read_follow_up(items: list[Any], read_calls: set[str] | frozenset[str] = frozenset()) -> bool:
    """The request ends with the result of a ``read_tool_output`` call (one in ``items``, or one
    of ``read_calls``, the ids of the read calls the model made): the proxy asks again after
    answering a read."""
    if not items or not isinstance(items[-1], dict) or items[-1].get("type") != "function_call_output":
        return False
    call_id = str(items[-1].get("call_id"))
    return call_id in read_calls or call_id in read_call_ids(items)


def reasoning_problems(items: list[Any], encrypted: dict[str, str]) -> list[str]:
    """Reasoning items of ``items`` the model never emitted, or whose ``encrypted_content`` is
    not byte-identical to what it emitted (``encrypted``: reasoning id -> content)."""
    problems = []
    for position, item in enumerate(items):
        if not isinstance(item, dict) or item.get("type") != "reasoning":
            continue
        item_id = item.get("id")
        emitted = encrypted.get(item_id) if isinstance(item_id, str) else None
        if emitted is None:
            problems.append(f"input[{position}]: reasoning item {item_id!r} was never emitted")
        elif item.get("encrypted_content") != emitted:
            got = item.get("encrypted_content")
            problems.append(
                f"input[{position}]: reasoning item {item_id!r} came back with encrypted_content "
                f"{str(got)[:40]!r}... (length {len(got) if isinstance(got, str) else None}), "
                f"not the {len(emitted)} bytes emitted"
            )
    return problems


def follower_changes(items: list[Any], followers: dict[str, str]) -> list[str]:
    """Reasoning items that came back followed by another item than the one that followed
    them in the answer that produced them (``followers``: reasoning id -> the id after it, as
    emitted). Informational: the Responses API is documented to refuse a reasoning item without
    its following item; whether it accepts a different one is not."""
    changes = []
    for position, item in enumerate(items):
        if not isinstance(item, dict) or item.get("type") != "reasoning":
            continue
        expected = followers.get(str(item.get("id")))
        following = items[position + 1] if position + 1 < len(items) else None
        got = following.get("id") if isinstance(following, dict) else None
        if expected is not None and got != expected:
            kind = following.get("type") if isinstance(following, dict) else None
            changes.append(
                f"input[{position}]: reasoning {item.get('id')!r} is followed by {kind} {got!r}, "
                f"not by {expected!r} that followed it in its answer"
            )
    return changes


def read_leaks(items: list[Any], follow_up: bool, read_calls: set[str]) -> list[str]:
    """``read_tool_output`` items in a request the client made (not a read follow-up round):
    they would come from the client's own history, which must never have seen one."""
    if follow_up:
        return []
    read_ids = read_call_ids(items) | read_calls
    leaks = [f"input[{p}]: a read_tool_output call" for p, i in enumerate(items) if is_read(i)]
    leaks += [
        f"input[{p}]: a read_tool_output result"
        for p, i in enumerate(items)
        if isinstance(i, dict) and i.get("type") == "function_call_output" and i.get("call_id") in read_ids
    ]
    return leaks
