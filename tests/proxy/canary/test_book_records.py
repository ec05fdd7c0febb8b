"""Reading the canary's book back when the store holds something a replica did not write."""

from __future__ import annotations

import orjson

from proxy.canary.book_records import decoded_blob, decoded_hash, epoch_of, pause_of, session_of, state_of


def test_an_unreadable_pause_is_a_pause() -> None:
    record = {"time": 5.0, "reason": ["error_share"], "checks": []}
    assert pause_of(orjson.dumps(record)) == (record, None)
    assert pause_of(None) == (None, None)
    unreadable = (b"garbage", b"", b"[]", b"null", b'{"reason": "x"}', b'{"time": 1, "reason": [1]}', b"\xff")
    for damaged in unreadable:
        paused, damage = pause_of(damaged)
        assert paused is not None and paused["reason"] == ["unreadable_pause_record"], damaged
        assert damage == "paused"


def test_an_unreadable_epoch_counts_from_zero() -> None:
    assert epoch_of(b"1733490000.25") == (1733490000.25, None)
    assert epoch_of(None) == (0.0, None)
    for damaged in (b"soon", b"nan", b"inf", b"-5", b"\xff", b""):
        assert epoch_of(damaged) == (0.0, "epoch"), damaged


def test_state_names_what_was_damaged_never_the_bytes() -> None:
    state = state_of(b"nope", b"sk-secret-looking-bytes")
    assert state["epoch"] == 0.0 and state["paused"]["reason"] == ["unreadable_pause_record"]
    assert state["damaged"] == ["epoch", "paused"]
    assert b"sk-secret" not in orjson.dumps(state)
    assert state_of(None, None) == {"epoch": 0.0, "paused": None, "damaged": []}


def test_a_session_is_read_only_when_it_is_the_books() -> None:
    good = {"arm": "treated", "first": "1.5", "last": "2", "requests": "3", "last_answer": "final"}
    read = {"arm": "treated", "first": 1.5, "last": 2.0, "requests": 3.0, "last_answer": "final"}
    assert session_of(good) == read
    # Fields that are not the book's are not read.
    assert session_of({**good, "note": "hello"}) == session_of(good)
    for bad in (
        {**good, "arm": "everyone"},
        {**good, "requests": "many"},
        {**good, "cost": "nan"},
        {**good, "errors": True},
        {**good, "last_answer": "maybe"},
        {"requests": "1"},  # no arm
    ):
        assert session_of(bad) is None, bad
    assert decoded_hash({b"arm": b"\xff"}) is None
    assert decoded_blob(b"not json") is None and decoded_blob(b"[1]") is None
    assert decoded_blob(b'{"arm": "holdout"}') == {"arm": "holdout"}
