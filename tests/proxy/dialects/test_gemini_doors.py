"""The seams a Gemini door needs beyond an adapter: the door table finds a door whose path names
the model (and a stream door only with ``alt=sse``), a key sent in ``?key=`` leaves the query,
Google's paths go to the Gemini and Code Assist providers (their root as base, the client's whole
path after it), errors are in Google's shape, a versioned base URL is refused, and
``countTokens`` bodies keep the shape the API takes."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from proxy.config.settings import ConfigError, load_settings
from proxy.dialects import DOORS, DoorTable, make_dialects
from proxy.dialects.agent_compaction import agent_compaction
from proxy.dialects.doors import Target
from proxy.upstream.providers import make_providers
from proxy.wire.errors import ProxyError, google_error_body
from proxy.wire.forwarding import key_from_query, upstream_request_headers

TABLE = DoorTable(DOORS)
GEMINI = Path(__file__).resolve().parents[2] / "fixtures" / "gemini"


def found(path: bytes, query: bytes = b"") -> tuple[str, Target] | None:
    hit = TABLE.find(b"POST", path, query)
    return None if hit is None else (hit[0].dialect, hit[1])


def test_a_door_whose_path_names_the_model() -> None:
    stream = b"/v1beta/models/gemini-2.5-pro:streamGenerateContent"
    assert found(stream, b"alt=sse") == ("gemini", Target("gemini-2.5-pro", True))
    assert found(stream, b"key=k&alt=sse") == ("gemini", Target("gemini-2.5-pro", True))
    assert found(stream) is None  # a JSON array stream: relayed as it comes
    assert found(b"/v1beta/models/gemini-2.5-pro:generateContent") == (
        "gemini",
        Target("gemini-2.5-pro", False),
    )
    assert found(b"/v1beta/models/m%2Fx:generateContent") == ("gemini", Target("m/x", False))
    assert found(b"/v1beta/models/gemini-2.5-pro:countTokens") == (
        "gemini_count",
        Target("gemini-2.5-pro", False),
    )
    assert found(b"/v1beta/models/a/b:generateContent") is None
    assert found(b"/v1beta/models/:generateContent") is None
    assert found(b"/v1beta/models/gemini-2.5-pro:embedContent") is None
    assert found(b"/v1internal:streamGenerateContent", b"alt=sse") == ("code_assist", Target(None, True))
    assert found(b"/v1internal:generateContent") == ("code_assist", Target(None, False))
    assert found(b"/v1/chat/completions") == ("chat", Target())
    assert TABLE.find(b"GET", b"/v1beta/models/gemini-2.5-pro:generateContent", b"") is None


def test_a_key_in_the_query_leaves_it() -> None:
    assert key_from_query(b"alt=sse&key=AIza%2Bx", b"key") == (b"alt=sse", b"AIza+x")
    assert key_from_query(b"key=k", b"key") == (b"", b"k")
    assert key_from_query(b"alt=sse", b"key") == (b"alt=sse", None)
    assert key_from_query(b"monkey=1&key=", b"key") == (b"monkey=1", None)
    # The client's own key (in any form) is the credential: the operator's is never added to it.
    headers = upstream_request_headers([(b"x-goog-api-key", b"mine")], fallback=(b"x-goog-api-key", b"ops"))
    assert headers == [(b"x-goog-api-key", b"mine")]


def test_googles_paths_go_to_their_providers() -> None:
    settings = load_settings(env={"COMPACTION_PROXY_GEMINI_API_KEY": "ops-key"})
    providers = make_providers(settings)
    gemini = providers.for_request(b"/v1beta/models/x:generateContent", [])
    assert gemini is providers.gemini and gemini.fallback == (b"x-goog-api-key", b"ops-key")
    assert gemini.url(b"/v1beta/models/x:streamGenerateContent", b"alt=sse") == (
        "https://generativelanguage.googleapis.com/v1beta/models/x:streamGenerateContent?alt=sse"
    )
    assert providers.for_request(b"/v1alpha/files", []) is providers.gemini
    assist = providers.for_request(b"/v1internal:loadCodeAssist", [])
    assert assist is providers.code_assist and assist.fallback is None
    assert assist.url(b"/v1internal:streamGenerateContent", b"alt=sse") == (
        "https://cloudcode-pa.googleapis.com/v1internal:streamGenerateContent?alt=sse"
    )
    assert providers.for_request(b"/v1/models", []) is providers.openai


def test_errors_are_in_googles_shape() -> None:
    body = orjson.loads(google_error_body(ProxyError(400, "contents: required")))
    assert body == {"error": {"code": 400, "message": "contents: required", "status": "INVALID_ARGUMENT"}}
    assert orjson.loads(google_error_body(ProxyError(401, "no key")))["error"]["status"] == "UNAUTHENTICATED"
    assert orjson.loads(google_error_body(ProxyError(504, "slow")))["error"]["status"] == "DEADLINE_EXCEEDED"
    assert orjson.loads(google_error_body(ProxyError(413, "big")))["error"]["status"] == "INVALID_ARGUMENT"


def test_a_base_url_with_the_api_version_is_refused() -> None:
    with pytest.raises(ConfigError, match="ends with the API version /v1beta"):
        load_settings(env={"COMPACTION_PROXY_GEMINI_URL": "https://generativelanguage.googleapis.com/v1beta"})
    settings = load_settings(env={"COMPACTION_PROXY_CODE_ASSIST_URL": "http://127.0.0.1:9/"})
    assert settings.gemini.code_assist_url == "http://127.0.0.1:9/"


def test_count_tokens_bodies_keep_the_shape_the_api_takes() -> None:
    count = make_dialects()["gemini_count"].at(Target("gemini-2.5-pro", False))
    history = [{"role": "user", "parts": [{"text": f"Why? handle=out_{'0' * 16}"}]}]
    plain = {"contents": history}
    parsed = count.parse(plain)
    assert parsed.neutral["model"] == "gemini-2.5-pro" and not parsed.stream
    assert count.render(parsed, parsed.neutral["messages"], [0]) == plain
    # With the read tool the model would be offered, the view is a whole request.
    offered = count.with_read_tool(plain, 100)
    assert set(offered) == {"generateContentRequest"}
    request = offered["generateContentRequest"]
    assert request["model"] == "models/gemini-2.5-pro" and request["contents"] == history
    assert request["tools"][0]["functionDeclarations"][0]["name"] == "read_tool_output"
    wrapped = {"generateContentRequest": {"model": "models/gemini-2.5-pro", "contents": history}}
    assert set(count.with_read_tool(wrapped, 100)["generateContentRequest"]) == {"model", "contents", "tools"}
    assert count.json_answer({"totalTokens": 12}) is None  # relayed as it comes


def test_gemini_clis_own_compression_is_recognized() -> None:
    gemini = make_dialects()["gemini"].at(Target("gemini-3.1-pro-preview-customtools", False))
    snapshot = orjson.loads((GEMINI / "gemini-cli-compression.json").read_bytes())
    assert agent_compaction([], gemini.parse(snapshot).neutral["messages"]) == "gemini-cli"
    verify = orjson.loads((GEMINI / "gemini-cli-compression-verify.json").read_bytes())
    last = verify["contents"][-1]["parts"][0]
    # The captured verification prompt is filler: its opening words as Gemini CLI writes them.
    verify["contents"][-1] = {
        "role": "user",
        "parts": [{"text": "Critically evaluate the <state_snapshot> " + last["text"]}],
    }
    assert agent_compaction([], gemini.parse(verify).neutral["messages"]) == "gemini-cli"
    turn = orjson.loads((GEMINI / "gemini-cli-turn4.json").read_bytes())
    assert agent_compaction([], gemini.parse(turn).neutral["messages"]) is None


def test_a_shadow_comparison_asks_one_json_answer() -> None:
    gemini = make_dialects()["gemini"]
    url = "https://generativelanguage.googleapis.com/v1beta/models/m:streamGenerateContent?alt=sse&x=1"
    assert (
        gemini.json_url(url)
        == "https://generativelanguage.googleapis.com/v1beta/models/m:generateContent?x=1"
    )
    assert gemini.json_url(url.replace("&x=1", "")).endswith("/v1beta/models/m:generateContent")
    assert make_dialects()["chat"].json_url("http://u/v1/chat/completions") == "http://u/v1/chat/completions"
