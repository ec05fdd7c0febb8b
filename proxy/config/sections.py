"""The sections of the settings file, one typed struct each (``Settings`` in ``settings.py``
holds one of each): the server, the upstreams, the ``models`` table, token counting, the
store, the read tool, shadow, events, sessions, logging, policies and their pins, the
summarizer, canary mode and tracing. Every key has its default here."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

import msgspec

from policies.encodings import CounterBackend
from policies.tokens import DEFAULT_MODEL_ENCODINGS
from proxy.config.merge import DEFAULT_MODEL_FACTORS

EncodingName = Literal["o200k_base", "cl100k_base"]
Mode = Literal["enforce", "shadow", "canary", "off"]


class Section(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A section: every key known (an unknown one stops the start), immutable once loaded."""


class ServerSettings(Section, frozen=True):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 64 * 1024 * 1024
    admin_token: str | None = None
    # Clients that present no credential, while upstream.api_key is set, are refused (401)
    # unless this is true: they then all share ONE tenant, so everyone on the network sees
    # everyone's saved outputs and events. (Without upstream.api_key, such clients reach a
    # keyless upstream, e.g. a local model server, as that one shared tenant.)
    allow_anonymous: bool = False
    # Names a request's Host may carry besides localhost, server.host and any IP address
    # (others get a 421: a DNS-rebinding page sends its own name). "*": any Host, for a proxy
    # behind a balancer that checks Host itself.
    allowed_hosts: tuple[str, ...] = ()
    # The request line and headers together, in bytes; larger ones get a 431 and are closed.
    max_header_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 65536
    # Seconds for a request's headers to arrive (from the connection, or from the first byte of
    # the next request on a kept-alive connection), and the longest wait for the next bytes of
    # its body; past either, a 408 and the connection is closed (slow or stuck clients).
    header_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    body_timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    # Chat bodies over this many bytes, or with more than this many messages, are parsed,
    # counted and compacted in a pool of large_request_workers processes, so that they never
    # hold the event loop (other clients and /healthz stay fast while they are processed).
    large_request_bytes: Annotated[int, msgspec.Meta(ge=65536)] = 8 * 1024 * 1024
    large_request_messages: Annotated[int, msgspec.Meta(ge=10)] = 2000
    large_request_workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # Worker processes. With more than one, metrics use prometheus-client's multiprocess mode
    # and session checkpoints are read from the store on every request (workers share it).
    workers: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # Seconds between glibc malloc_trim calls that return freed heap pages to the OS (0: never).
    malloc_trim_seconds: Annotated[float, msgspec.Meta(ge=0)] = 1.0

    def __post_init__(self) -> None:
        for entry in self.allowed_hosts:
            # A host name or address, as a Host header carries it (a port is ignored): a URL or
            # a path here would never match, and every request would get a 421.
            if not re.fullmatch(r"\*|\[[0-9A-Fa-f:.]+\](:\d+)?|[^\s/:@\[\]]+(:\d+)?|[0-9A-Fa-f:.]+", entry):
                raise ValueError(
                    f"allowed_hosts: {entry!r} is not a host name or address, e.g. proxy.internal"
                )


class UpstreamSettings(Section, frozen=True):
    base_url: str = "https://api.openai.com/v1"
    api_key: str | None = None
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 600.0
    connect_timeout: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 512
    max_keepalive_connections: Annotated[int, msgspec.Meta(ge=0)] = 128
    # The wire client under the httpx transport seam: the proxy's own HTTP/1.1 client
    # (``builtin``: httptools' C parser on asyncio, the least CPU), aiohttp's, or httpx's.
    http_client: Literal["builtin", "aiohttp", "httpx"] = "builtin"
    # What the proxy reads of an upstream's answer to its own read_tool_output rounds: a JSON
    # body and one event of a stream at most (past them: a clean 502 upstream_too_large).
    max_response_bytes: Annotated[int, msgspec.Meta(ge=1 << 20)] = 64 << 20
    max_event_bytes: Annotated[int, msgspec.Meta(ge=1 << 16)] = 16 << 20
    # Learn each model's window from the provider (its metadata, its refusals); see config.yml.
    learn_windows: bool = True

    def __post_init__(self) -> None:
        check_base_url(self.base_url, versioned=True)


# Paths the proxy appends to a base URL itself (a base URL ending in one is a common mistake).
_ENDPOINT_PATHS = (
    "/chat/completions",
    "/completions",
    "/responses",
    "/messages/count_tokens",
    "/messages",
    "/embeddings",
    "/models",
)
# OpenAI-compatible APIs that serve /chat/completions at their root, without a version prefix.
_VERSIONLESS_HOSTS = frozenset({"api.perplexity.ai", "api.deepseek.com"})


def check_base_url(url: str, *, versioned: bool) -> None:
    """An upstream's base URL: a plain http(s) URL with no credentials, and no mistake
    ``base_url_problem`` knows (raises ValueError saying what to write instead)."""
    if not re.match(r"^https?://[^/\s]+", url):
        raise ValueError("must be an http:// or https:// URL")
    if "?" in url or "#" in url or "\\" in url:
        raise ValueError("must be a plain URL: no query, fragment or backslash")
    if "@" in url.split("://", 1)[1].split("/", 1)[0]:
        raise ValueError("must not hold user:password@; set the key with api_key instead")
    problem = base_url_problem(url, versioned=versioned)
    if problem:
        raise ValueError(problem)


def base_url_problem(url: str, *, versioned: bool) -> str | None:
    """What is wrong with an upstream base URL, with the URL that fixes it (None: nothing).
    ``versioned``: an OpenAI-compatible API, whose base URL carries its version (``/v1``)."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    for endpoint in _ENDPOINT_PATHS:
        if path.endswith(endpoint):
            base = path[: -len(endpoint)]
            if not versioned:
                base = base.removesuffix("/v1")
            fixed = urlunsplit((parts.scheme, parts.netloc, base or ("/v1" if versioned else ""), "", ""))
            return f"base_url {url} ends with the endpoint path {endpoint}, which the proxy adds: use {fixed}"
    if versioned and not path and parts.hostname not in _VERSIONLESS_HOSTS:
        fixed = urlunsplit((parts.scheme, parts.netloc, "/v1", "", ""))
        return (
            f"base_url {url} has no version prefix, and OpenAI-compatible servers (OpenAI, vLLM, "
            f"llama.cpp, Ollama, LM Studio) answer under /v1: use {fixed}"
        )
    return None


class AnthropicSettings(Section, frozen=True):
    # As Anthropic's SDKs take it (no /v1): requests to /v1/messages go to <base_url>/v1/messages.
    base_url: str = "https://api.anthropic.com"
    # Sent as x-api-key for clients that send no credential of their own.
    api_key: str | None = None

    def __post_init__(self) -> None:
        check_base_url(self.base_url, versioned=False)


class GeminiSettings(Section, frozen=True):
    # The Gemini API's root, as Google's SDKs and GOOGLE_GEMINI_BASE_URL take it (no version):
    # requests to /v1beta/... go to <base_url>/v1beta/...
    base_url: str = "https://generativelanguage.googleapis.com"
    # Sent as x-goog-api-key for clients that send no credential of their own.
    api_key: str | None = None
    # Gemini CLI's Code Assist endpoint (its CODE_ASSIST_ENDPOINT): requests to /v1internal:...
    # go to <code_assist_url>/v1internal:...
    code_assist_url: str = "https://cloudcode-pa.googleapis.com"

    def __post_init__(self) -> None:
        for url in (self.base_url, self.code_assist_url):
            check_base_url(url, versioned=False)
            version = urlsplit(url).path.rstrip("/").rpartition("/")[2]
            if version in ("v1", "v1beta", "v1alpha", "v1internal"):
                root = url.rstrip("/").removesuffix("/" + version)
                raise ValueError(
                    f"{url} ends with the API version /{version}, which the client's path has: use {root}"
                )


class ModelSettings(Section, frozen=True):
    # Context window in tokens, the packaged encoding that counts them, and for models whose
    # tokenizer is not packaged the factor applied to that count (null: the next matching entry's).
    window: Annotated[int, msgspec.Meta(ge=1024)] | None = None
    encoding: EncodingName | None = None
    token_factor: Annotated[float, msgspec.Meta(gt=0.1, le=10)] | None = None
    # US dollars per million tokens: the session page's savings and the canary's cost (null: none).
    input_price: Annotated[float, msgspec.Meta(ge=0)] | None = None
    cached_input_price: Annotated[float, msgspec.Meta(ge=0)] | None = None
    cache_write_price: Annotated[float, msgspec.Meta(ge=0)] | None = None
    output_price: Annotated[float, msgspec.Meta(ge=0)] | None = None


class TokenSettings(Section, frozen=True):
    default_encoding: EncodingName = "o200k_base"
    model_encodings: dict[str, EncodingName] = msgspec.field(
        default_factory=lambda: dict(DEFAULT_MODEL_ENCODINGS)  # type: ignore[arg-type]
    )
    cache_max_chars: Annotated[int, msgspec.Meta(ge=0)] = 64 * 1024 * 1024
    # What counts: ``auto`` uses rs_bpe (two to three times faster) once it has counted a probe
    # set exactly as tiktoken does, tiktoken otherwise; ``tiktoken`` always uses tiktoken.
    counter: CounterBackend = "auto"
    # Models whose tokenizer is not packaged: the packaged encoding's count times this factor is
    # their count (glob patterns, first match wins). 1.3 is Claude's measured ratio to o200k on
    # code and prose (about 1.15-1.25) with a safety margin.
    model_factors: dict[str, Annotated[float, msgspec.Meta(gt=0.1, le=10)]] = msgspec.field(
        default_factory=lambda: dict(DEFAULT_MODEL_FACTORS)
    )
    # Learn those models' factors from the prompt tokens the upstream reports (per model,
    # bounded, kept in <state_dir>/token_factors.json), so the window is held to the real count.
    calibrate: bool = True


class StoreSettings(Section, frozen=True):
    backend: Literal["sqlite", "redis"] = "sqlite"
    # With backend redis: the server every replica shares.
    redis_url: str = "redis://127.0.0.1:6379/0"
    # SQLite file (null: <state_dir>/compaction.db).
    path: str | None = None
    keep_days: Annotated[float, msgspec.Meta(gt=0)] = 7.0
    expiry_interval_seconds: Annotated[float, msgspec.Meta(gt=0)] = 3600.0
    # SQLite: how long a statement waits for another process's lock before the request goes
    # on uncompacted (fail open).
    busy_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 1.0
    # SQLite: how long a batch of events waits for more before it is written (one transaction
    # per batch; the events API writes this process's waiting batch before it reads).
    event_batch_seconds: Annotated[float, msgspec.Meta(ge=0, le=5)] = 0.05
    # Redis: how long a command waits to connect or for an answer (retried once) before the
    # request goes on uncompacted; after a failure the store pauses for a second.
    redis_timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=60)] = 0.5


class ReadToolSettings(Section, frozen=True):
    max_rounds: Annotated[int, msgspec.Meta(ge=0, le=32)] = 4
    max_lines: Annotated[int, msgspec.Meta(ge=1)] = 1000
    # read_tool_output calls answered per model answer; further ones are told to wait.
    max_calls_per_answer: Annotated[int, msgspec.Meta(ge=1, le=128)] = 8
    # Longest line of a read result, in characters (longer ones are clipped with a marker).
    max_line_chars: Annotated[int, msgspec.Meta(ge=80)] = 2000
    # Most bytes and tokens in one read result (also bounded by the room left in the window).
    max_result_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 65536
    max_result_tokens: Annotated[int, msgspec.Meta(ge=100)] = 8000
    # Most bytes of read results per client request, over all rounds.
    max_total_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 262144
    # Seconds a read (pattern search, formatting) may take in its worker thread.
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0)] = 5.0


class ShadowSettings(Section, frozen=True):
    # Also send a sample of compacted views upstream in the background and compare decisions.
    compare: bool = False
    sample_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1
    max_concurrent: Annotated[int, msgspec.Meta(ge=1)] = 4


class EventSettings(Section, frozen=True):
    # Also record a light event for requests on which the policy did nothing.
    record_skipped: bool = False
    # Append every event as a JSON line to this file too (null: the store only).
    jsonl_path: str | None = None


class SessionSettings(Section, frozen=True):
    # Sessions whose checkpoints are kept in memory; the least recently used go first.
    max_sessions: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    # Each recent conversation's last request is kept (its body, messages, counts and digests)
    # so the next one parses, counts and digests only what it adds; this bounds the tokens
    # they hold (the bodies: 4 bytes a token; 0: off).
    known_prefix_tokens: Annotated[int, msgspec.Meta(ge=0)] = 8 * 1024 * 1024


class LoggingSettings(Section, frozen=True):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


class PinSettings(Section, frozen=True):
    # Results of these tools (with their calls) are never cleared, offloaded or summarized.
    tools: list[str] = msgspec.field(default_factory=list)
    # Messages whose text matches one of these regular expressions are kept verbatim too.
    patterns: list[str] = msgspec.field(default_factory=list)


class PolicySettings(Section, frozen=True):
    description: str = ""
    # Ordered stage configurations; their keys are validated by policies.pipeline.
    stages: list[dict[str, Any]] = msgspec.field(default_factory=list)
    # Final token safeguard: the view never exceeds the model's window.
    safeguard: bool = True
    pins: PinSettings = msgspec.field(default_factory=lambda: PinSettings())


class SummarizerSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    kind: Literal["ledger", "openai"] = "ledger"
    base_url: str | None = None
    api_key: str | None = None
    # Whose summaries ``api_key`` pays for: ``operator_clients`` (those that send no key and
    # whose upstream gets the operator's key) or ``every_client`` (a deployment whose every
    # client is the operator's own, a replay: the operator says so explicitly).
    api_key_pays_for: Literal["operator_clients", "every_client"] = "operator_clients"
    model: str = "gpt-4o-mini"
    timeout: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=10)] = 2
    max_output_tokens: Annotated[int, msgspec.Meta(ge=64)] = 2000
    # Largest summarizer input (prompt plus history), in tokens; null: no limit.
    max_input_tokens: Annotated[int, msgspec.Meta(ge=1000)] | None = None
    breaker_failures: Annotated[int, msgspec.Meta(ge=1)] = 3
    breaker_cooldown: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    # Prepare the model summary ahead, off the request path, once a request passes this share
    # of the window; a compaction point then never waits for the summarizer (it uses a checked
    # prepared summary, or the ledger alone at once). On by default: a summarizer's latency
    # (seconds) must not land on the agent's step. null: a compaction point waits for it.
    prepare_at: Annotated[float, msgspec.Meta(gt=0, lt=1)] | None = 0.6
    # Preparations running at once per process, all tenants: served round-robin by tenant,
    # newest range first within one (proxy/summaries/prepare_queue.py). 4 in flight at 2-5 s a
    # summary make about one a second, far under a small model's rate limits.
    prepare_concurrency: Annotated[int, msgspec.Meta(ge=1, le=256)] = 4
    # Preparations of one tenant waiting for a slot; past it the oldest waiting is dropped
    # (counted: prepared_summaries_total{result="dropped"}).
    prepare_queue: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 64

    def __post_init__(self) -> None:
        if self.base_url is not None and not re.match(r"^https?://[^/\s]+", self.base_url):
            raise ValueError("base_url must be an http:// or https:// URL")


class CanaryGate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    # Sessions each arm needs before the gate judges anything.
    min_sessions: Annotated[int, msgspec.Meta(ge=1)] = 30
    # At most this many more points of requests answered with a context-window error.
    max_context_error_increase: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.02
    # At most this many more points of requests answered with any other upstream error.
    max_error_increase: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.05
    # Re-acquisitions per session (read_tool_output calls and repeated tool calls) at most this
    # many times the holdout's, beyond a floor of extra ones always tolerated.
    max_reacquisition_ratio: Annotated[float, msgspec.Meta(ge=1)] = 1.5
    reacquisition_floor: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    # Cost per session at most this many times the holdout's.
    max_cost_ratio: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    confidence: Annotated[float, msgspec.Meta(gt=0.5, lt=1)] = 0.95


class CanarySettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    # The share of sessions the policy is applied to (mode: canary); the rest is the holdout.
    share: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.1
    # Change it to draw a new split of sessions.
    salt: str = "canary"
    gate: CanaryGate = msgspec.field(default_factory=CanaryGate)
    # How often each replica reads the figures back and judges.
    evaluate_every_seconds: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    # A session whose last answer asked for a tool and which has been idle this long was
    # abandoned mid-tool-loop; one whose last answer had no tool call ended with an answer.
    idle_seconds: Annotated[float, msgspec.Meta(gt=0)] = 600.0


class TracingSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    # Export a trace of every sampled request over OTLP/HTTP (protobuf).
    enabled: bool = False
    # The collector's OTLP/HTTP traces endpoint.
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    # Headers sent to the collector (for example an auth token for a hosted one).
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    service_name: str = "compaction-proxy"
    # Share of requests traced when the client sent no sampled traceparent; a client's
    # decision (its traceparent's sampled flag) is always followed.
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0
    # Longest wait before finished spans are sent to the collector, in milliseconds.
    export_delay_ms: Annotated[int, msgspec.Meta(ge=1)] = 2000


# Where OpenAI itself answers remote compaction: an upstream at this host runs it (``auto``).
OPENAI_HOST = "api.openai.com"


class CompactSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    # Remote compaction (`POST /v1/responses/compact`, and a Responses `input` ending with a
    # `compaction_trigger` item, Codex's "remote compaction v2"): `proxy` answers it with the
    # proxy's own compaction and one `compaction` item that stands for it; `relay` sends it
    # upstream as it came (only OpenAI runs it); `auto`: relay when upstream.base_url's host is
    # api.openai.com, else proxy.
    answer: Literal["auto", "proxy", "relay"] = "auto"
    # The key that signs the proxy's compaction items (HMAC-SHA256, with the client's tenant):
    # null makes one at first use, kept in the store (replicas on one Redis share it).
    secret: Annotated[str, msgspec.Meta(min_length=16)] | None = None

    def answers(self, upstream_base_url: str) -> Literal["proxy", "relay"]:
        """Who answers remote compaction for an upstream at ``upstream_base_url``."""
        if self.answer != "auto":
            return self.answer
        host = (urlsplit(upstream_base_url).hostname or "").lower()
        return "relay" if host == OPENAI_HOST else "proxy"
