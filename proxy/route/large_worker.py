"""What a worker process of the large-request pool does (``large_requests.py`` runs the pool):
read a body, inspect it (parse, count, digest) and apply a policy to it, with the same
``Policy.apply`` and summarizer configuration as the event loop. It keeps the last body it
parsed, keyed by its digest, so ``apply`` after ``inspect`` does not parse it again; it
holds no state the parent needs (sessions, checkpoints and the store stay in the parent)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from policies.digests import Digests
from policies.facts import LargeRequestFact, StageFacts
from policies.pipeline import (
    Offload,
    Policy,
    PolicyOutcome,
    build_policies,
    requested_answer_tokens,
)
from policies.prompt_cache import PromptCache
from policies.tokens import TokenCounter
from proxy.config.settings import Settings, policy_specs
from proxy.dialects import make_dialects
from proxy.dialects.agent_compaction import agent_compaction
from proxy.dialects.base import Dialect, Parsed
from proxy.dialects.doors import BODY_SAYS, Target
from proxy.state.memory import malloc_trim
from proxy.state.store import decode_checkpoint, encode_checkpoint
from proxy.summaries.credentials import SummaryCredential
from proxy.wire.errors import ProxyError
from proxy.wire.json_body import dump_json, parse_json


def body_key(body: bytes) -> bytes:
    return hashlib.blake2b(body, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Inspected:
    """What the parent needs to know of a large body before compacting it."""

    error: tuple[int, str, str | None] | None = None  # status, message, param
    model: Any = None  # the model the request is for
    messages: int = 0
    skipped: str | None = None  # a malformed history: sent as it came
    marked: bool = False  # the body's lone surrogates stand as marks (``wire/surrogates.py``)
    root: str = ""
    digests: list[str] = field(default_factory=list)
    stream: bool = False
    notes: dict[str, Any] = field(default_factory=dict)
    # The agent's own compaction request (``proxy/dialects/agent_compaction.py``): which agent, and the
    # prompt tokens and answer length the parent decides with, as for a body of any size.
    agent: str | None = None
    agent_tokens: int = 0
    requested: int = 0


@dataclass(frozen=True, slots=True)
class Computed:
    tokens_before: int
    tokens_after: int
    mechanisms: tuple[str, ...]
    trigger: str | None
    facts: StageFacts
    offloads: list[tuple[str, str, str]]
    checkpoint: bytes
    view: bytes | None  # the whole body to send, or None: the client's bytes go as they are

    messages: bytes | None  # the view's neutral messages (for the event and the handle check)
    origin: tuple[int, ...] | None
    lenient: bool = False  # the body was read by Python's parser

    def outcome(self) -> tuple[PolicyOutcome, dict[str, Any] | None]:
        """The policy outcome the parent goes on with, and the view body parsed (if any)."""
        # Written by ``dump_json``; from a body only Python read, Python reads it back (orjson
        # would read an integer beyond 64 bits as the nearest float).
        read = json.loads if self.lenient else orjson.loads
        parsed = read(self.view) if self.view is not None else None
        outcome = PolicyOutcome(
            messages=read(self.messages) if self.messages is not None else None,
            origin=self.origin,
            tokens_before=self.tokens_before,
            tokens_after=self.tokens_after,
            mechanisms=self.mechanisms,
            checkpoint=decode_checkpoint(self.checkpoint),
            facts=self.facts,
            offloads={h: Offload(h, content, description) for h, content, description in self.offloads},
            trigger=self.trigger,
        )
        return outcome, parsed


class WorkerState:
    def __init__(self, settings: Settings) -> None:
        self.counter = TokenCounter(
            default_encoding=settings.tokens.default_encoding,
            model_encodings=settings.tokens.model_encodings,
            cache_max_chars=settings.tokens.cache_max_chars,
            backend=settings.tokens.counter,
        )
        self.counter.warm_up()
        self.policies: dict[str, Policy] = build_policies(policy_specs(settings))
        self.dialects = make_dialects()
        self.adapter: Dialect = self.dialects["chat"]  # of the body parsed last
        # Whether its lone surrogates stand as marks: its view, sent back marked, is written
        # upstream by the parent (``Inspected.marked``).
        self.lenient = self.marked = False
        self.digests = Digests(counter=self.counter)
        self.loop = asyncio.new_event_loop()
        self.summarizer: Any = None
        if settings.summarizer.kind == "openai":
            from proxy.summaries.summarizer import OpenAISummarizer

            self.summarizer = OpenAISummarizer(
                settings.summarizer, base_url=settings.upstream.base_url, api_key=settings.upstream.api_key
            )
        self._parsed: tuple[bytes, Parsed] | None = None
        self._read: tuple[bytes, Any, bool, bool] | None = None
        self.trim = malloc_trim()

    def forget(self) -> None:
        self._parsed = self._read = None

    def read(self, body: bytes, dialect: str) -> list[Any]:
        """Parse the body's JSON (kept for ``parse``) and say what the dialect's ``restore``
        would look up for it, which the parent, holding that state, finds."""
        self._parsed = None
        data, lenient, marked = parse_json(body)
        self._read = (body_key(body), data, lenient, marked)
        return self.dialects[dialect].restore_wanted(data)

    def parse(self, body: bytes, dialect: str, found: Any = None, target: Target = BODY_SAYS) -> Parsed:
        """Read the body with its dialect (a ``ProxyError`` for one it cannot read), with what
        the parent found for ``read``'s question put back; ``target``: what its path says."""
        self._parsed = None
        key = body_key(body)
        read, self._read = self._read, None
        _, data, lenient, marked = read if read is not None and read[0] == key else (key, *parse_json(body))
        adapter = self.dialects[dialect].at(target)
        data, restored = adapter.restore_splice(data, found) if found else (data, 0)
        parsed = adapter.parse(data)
        if restored:
            parsed.notes["restored_read_rounds"] = restored
        self._parsed = (key, parsed)
        self.adapter, self.lenient, self.marked = adapter, lenient, marked
        return parsed

    def parsed(self, key: bytes) -> Parsed:
        """The body phase one parsed (the parent sends phase two to the same process)."""
        if self._parsed is None or self._parsed[0] != key:
            raise LookupError("phase two reached a worker that did not parse the body")
        return self._parsed[1]


# The worker process's state, set by ``init_worker`` when the process starts.
_worker: WorkerState | None = None


def init_worker(settings_json: bytes) -> None:
    global _worker
    _worker = WorkerState(msgspec.json.decode(settings_json, type=Settings))


def read_in_worker(body: bytes, dialect: str) -> list[Any] | Inspected:
    """Phase zero, when the parent holds something the dialect's ``restore`` could put back:
    the JSON read (kept for phase one), and what to look up."""
    assert _worker is not None
    try:
        return _worker.read(body, dialect)
    except ProxyError as error:
        return Inspected(error=(error.status, error.message, error.param))


def inspect_in_worker(
    body: bytes,
    dialect: str,
    target: Target,
    tenant: str,
    with_digests: bool,
    headers: list[tuple[bytes, bytes]],
    found: Any = None,
) -> Inspected:
    """Phase one: read (kept for phase two, which runs in this same process) with ``found`` put
    back, check, digest."""
    from proxy.state.sessions import root_session

    assert _worker is not None
    try:
        parsed = _worker.parse(body, dialect, found, target)
    except ProxyError as error:
        return Inspected(error=(error.status, error.message, error.param))
    neutral = parsed.neutral
    messages = neutral["messages"]
    digests = [_worker.digests.message(m) for m in messages] if with_digests and not parsed.skipped else []
    agent = None if parsed.skipped else agent_compaction(headers, messages)
    return Inspected(
        agent=agent,
        agent_tokens=_worker.counter.count_request(neutral).total if agent else 0,
        requested=requested_answer_tokens(neutral),
        model=neutral.get("model"),
        messages=len(messages),
        skipped=parsed.skipped,
        root=root_session(neutral, tenant),
        digests=digests,
        stream=parsed.stream,
        notes=parsed.notes,
        marked=_worker.marked,
    )


def apply_in_worker(
    body_key: bytes,
    policy: str,
    window: int,
    checkpoint: bytes | None,
    injected_tokens: int,
    session: str,
    credential: SummaryCredential,
    skip: bool,
    cache: PromptCache | None = None,
) -> Computed:
    assert _worker is not None
    parsed = _worker.parsed(body_key)
    chosen = _worker.policies[policy]
    if skip:
        chosen = Policy(name=chosen.name, description=chosen.description, stages=())
    summarizer = _worker.summarizer.for_session(session, credential) if _worker.summarizer else None
    outcome = _worker.loop.run_until_complete(
        chosen.apply(
            parsed.neutral,
            _worker.counter,
            window=window,
            checkpoint=decode_checkpoint(checkpoint) if checkpoint else None,
            summarizer=summarizer,
            digests=_worker.digests,
            injected_tokens=injected_tokens,
            cache=cache,
        )
    )
    view = None
    if outcome.messages is not None and outcome.origin is not None:
        view = dump_json(_worker.adapter.render(parsed, outcome.messages, outcome.origin))
    elif parsed.notes.get("restored_read_rounds"):
        # The policy changed nothing, but what was put back must reach the upstream.
        view = dump_json(parsed.body)
    # The body is done with: its parsed copy goes, and the heap's free pages go back to the OS.
    _worker.forget()
    computed = Computed(
        tokens_before=outcome.tokens_before,
        tokens_after=outcome.tokens_after,
        mechanisms=outcome.mechanisms,
        trigger=outcome.trigger,
        facts=msgspec.structs.replace(outcome.facts, large_request=LargeRequestFact(worker_process=True)),
        offloads=[(o.handle, o.content, o.description) for o in outcome.offloads.values()],
        checkpoint=encode_checkpoint(outcome.checkpoint),
        view=view,
        messages=dump_json(outcome.messages) if outcome.messages is not None else None,
        origin=outcome.origin,
        lenient=_worker.lenient,
    )
    del parsed, outcome
    if _worker.trim is not None:
        _worker.trim()
    return computed
