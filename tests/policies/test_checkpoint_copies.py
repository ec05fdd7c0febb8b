"""The checkpoint's own copy and comparison, used on every request instead of
``dataclasses.replace``: the same result as ``replace`` for every field."""

from dataclasses import fields, replace

import pytest

from policies.view import Checkpoint

_VALUES = {
    "summary": {"role": "user", "content": "summary"},
    "summary_at": 2,
    "covered": 5,
    "pinned": (3,),
    "covered_digest": "abc",
    "placeholders": {"1:x": {"role": "tool", "content": "[saved]"}},
    "dropped": frozenset({"2:y"}),
    "guidance": {"role": "user", "content": "verify"},
    "handles": ("h1",),
    "compactions": 1,
    "requests": 7,
    "recent_compactions": (4,),
    "short_of_target": True,
    "tight": True,
    "prefix_written_at": 4,
    "no_read_room_reported": True,
}


def test_every_field_has_a_sample_value() -> None:
    assert {f.name for f in fields(Checkpoint)} - {"ledger"} == set(_VALUES)


@pytest.mark.parametrize("name", sorted(_VALUES))
def test_with_requests_is_replace(name: str) -> None:
    checkpoint = Checkpoint(**{name: _VALUES[name]})
    copy = checkpoint.with_requests(11)
    assert copy == replace(checkpoint, requests=11)
    assert type(copy) is Checkpoint and copy is not checkpoint
    assert checkpoint.requests == (_VALUES["requests"] if name == "requests" else 0)


@pytest.mark.parametrize("name", sorted(_VALUES))
def test_same_but_requests_sees_every_other_field(name: str) -> None:
    base = Checkpoint(requests=3)
    changed = Checkpoint(**{"requests": 3, name: _VALUES[name]})
    assert base.same_but_requests(base.with_requests(9))
    # An equal value in another object is the same state.
    assert changed.same_but_requests(replace(changed, **{"requests": 1, name: _VALUES[name]}))
    assert base.same_but_requests(changed) is (name == "requests")
