from __future__ import annotations

import socket
from typing import Any

import pytest

import policies.tokens as tokens
from policies.encodings import EXPECTED_SHA256, TextCounter, load_encoding, read_rank_file
from policies.text_counts import ObjectCounts
from policies.tokens import REPLY_PRIMING, TOKENS_PER_MESSAGE, TokenCounter


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Counting must not touch the network, nor tiktoken's download cache."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("token counting tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty-cache"))


@pytest.mark.usefixtures("no_network")
def test_encodings_load_offline_and_encode_exactly() -> None:
    cl100k = load_encoding("cl100k_base")
    assert cl100k.encode("hello world") == [15339, 1917]
    o200k = load_encoding("o200k_base")
    assert o200k.n_vocab == 200019
    assert (
        o200k.decode(o200k.encode("def f(x):\n    return x ** 2  # café"))
        == "def f(x):\n    return x ** 2  # café"
    )


def test_packaged_rank_files_match_published_checksums() -> None:
    import hashlib

    for name, digest in EXPECTED_SHA256.items():
        assert hashlib.sha256(read_rank_file(name)).hexdigest() == digest


@pytest.mark.usefixtures("no_network")
def test_request_count_includes_framing_and_tools() -> None:
    counter = TokenCounter()
    enc = load_encoding("o200k_base")
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello world"}],
    }
    expected = sum(
        TOKENS_PER_MESSAGE + len(enc.encode(m["role"])) + len(enc.encode(m["content"]))
        for m in body["messages"]
    )
    assert counter.count_request(body).total == expected + REPLY_PRIMING
    with_tools = {**body, "tools": [{"type": "function", "function": {"name": "ls", "parameters": {}}}]}
    assert counter.count_request(with_tools).total > counter.count_request(body).total


def test_model_families_choose_their_encoding() -> None:
    counter = TokenCounter()
    assert counter.encoding_for("gpt-4o-mini") == "o200k_base"
    assert counter.encoding_for("gpt-4-turbo") == "cl100k_base"
    assert counter.encoding_for("gpt-3.5-turbo") == "cl100k_base"
    assert counter.encoding_for("some-local-model") == "o200k_base"
    assert counter.encoding_for(None) == "o200k_base"
    custom = TokenCounter(default_encoding="cl100k_base", model_encodings={"my-*": "o200k_base"})
    assert custom.encoding_for("my-model") == "o200k_base"
    assert custom.encoding_for("gpt-4o") == "cl100k_base"
    with pytest.raises(ValueError, match="unsupported encoding"):
        TokenCounter(default_encoding="p50k_base")


def test_parts_tool_calls_and_unknown_shapes_are_counted() -> None:
    counter = TokenCounter()
    message = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:..."}},
        ],
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
        ],
        "name": "bot",
    }
    assert counter.count_message(message, "o200k_base") > 85 + TOKENS_PER_MESSAGE
    # Malformed input never raises.
    assert counter.count_message("not a message", "o200k_base") == TOKENS_PER_MESSAGE
    assert counter.count_message({"role": 5, "content": {"odd": True}}, "o200k_base") > TOKENS_PER_MESSAGE


def test_repeated_text_is_not_encoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = TokenCounter()
    counter.warm_up(["o200k_base"])
    encoding = counter._encodings["o200k_base"]
    calls: list[int] = []

    def spy(text: str) -> int:
        calls.append(len(text))
        return encoding.count(text)

    counter._encodings["o200k_base"] = TextCounter(spy, encoding.backend)
    history = [{"role": "user", "content": f"step {i} " + "x" * 500} for i in range(50)]
    first = counter.count_request({"model": "gpt-4o", "messages": history})
    cold_calls = len(calls)
    history.append({"role": "tool", "content": "new output " * 20, "tool_call_id": "c"})
    second = counter.count_request({"model": "gpt-4o", "messages": history})
    # Only the new message's texts were encoded.
    assert len(calls) - cold_calls == 2
    assert second.total > first.total
    assert second.messages[:50] == first.messages


def test_cache_is_bounded() -> None:
    counter = TokenCounter(cache_max_chars=10_000)
    for i in range(200):
        counter.count_text(f"{i} " + "y" * 200)
    assert len(counter._caches["o200k_base"]) < 100


def test_each_tool_schema_object_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The policy and each read round count the same schemas, and the next request of a
    conversation brings the same objects: each is encoded once. An equal schema that is another
    object is encoded on its own (identity, never a guess), and so is a changed list's new one."""
    encoded: list[object] = []
    real = tokens.json_text

    def counting(value: object) -> str:
        encoded.append(value)
        return real(value)

    monkeypatch.setattr(tokens, "json_text", counting)
    schemas = [{"type": "function", "function": {"name": f"tool_{i}", "parameters": {}}} for i in range(3)]
    counter = TokenCounter()
    alone = counter.count_tools(schemas, "o200k_base")
    assert len(encoded) == 3
    request = counter.for_request()
    assert request.count_tools(schemas, "o200k_base") == alone
    extra = {"type": "function", "function": {"name": "x"}}
    assert request.count_tools([*schemas, extra], "o200k_base") > alone
    assert counter.for_request().count_tools(schemas, "o200k_base") == alone
    assert len(encoded) == 3 + 1
    copies = [dict(schema) for schema in schemas]
    assert counter.count_tools(copies, "o200k_base") == alone
    assert len(encoded) == 3 + 1 + 3


def test_object_counts_hold_their_objects_and_keep_what_is_in_use() -> None:
    counts = ObjectCounts(max_objects=2)
    first, second, third = {"a": 1}, {"b": 2}, {"c": 3}
    counts.put("enc", first, 10)
    counts.put("enc", second, 20)
    counts.put("enc", third, 30)  # a new generation: the first two are the old one
    assert counts.get("enc", first) == 10  # promoted, still in use
    assert counts.get("other", first) is None  # per encoding
    counts.put("enc", {"d": 4}, 40)  # another generation: the second one is dropped
    assert counts.get("enc", second) is None
    assert counts.get("enc", first) == 10 and counts.get("enc", third) == 30
    assert counts.get("enc", {"a": 1}) is None  # an equal object is not the object
