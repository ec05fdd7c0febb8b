"""Compaction events: one versioned record per request on which a policy did something.

An event says what was done, why, and with what inputs (policy name, version and a hash of
its resolved configuration; prompt family and version; trigger, threshold and window; the
covered range of the client's messages and the digest of its content; tokens and messages
before and after; handles offloaded; the summary's hash and the summarizer's model, tokens,
seconds and any fallback; the read_tool_output rounds with their usage), plus the session
checkpoint that produced the view. The observer adds the compaction's own cost
(``compaction_cost``: the summarizer's tokens of this point, apart from the prompt; a summary
prepared ahead has an event of its own, ``kind: "preparation"``, made by
``proxy/telemetry/compaction_cost.py``: an event with a ``kind`` is no request's). At a
compaction point the event also holds the view itself (compressed); between points the
checkpoint and the client's history (which the agent keeps, or a recorded trace) rebuild it
with ``policies.sticky.apply_checkpoint``; the outputs its handles name are in the store.

Events are written to the store (tenant-scoped) and, when configured, appended as JSON lines
to a file. They never hold API keys; the summary text and placeholders in the checkpoint are
content, so the store's owner-only permissions apply to them as to saved outputs.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import orjson
import structlog

from policies.facts import SummaryFact, TriggerFact
from policies.pipeline import Checkpoint, PolicyOutcome
from proxy.state.checkpoint_states import SENTINEL_JSON, SENTINEL_REQUESTS, CheckpointState, template_digest
from proxy.state.store import Store, encode_checkpoint
from proxy.telemetry.exchange import LoopResult

SCHEMA_VERSION = 1


def config_hash(spec: Any) -> str:
    return hashlib.blake2b(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS), digest_size=8).hexdigest()


def new_event_id() -> str:
    """``ev_``, the microsecond as 14 hex digits, then 48 random bits: ids in the order they
    were made, so the store appends each one to its index instead of writing a random page."""
    return f"ev_{time.time_ns() // 1000:014x}{os.urandom(6).hex()}"


def build_event(
    *,
    request_id: str,
    tenant: str,
    session: str,
    model: object,
    mode: str,
    policy: str,
    policy_version: str,
    policy_hash: str,
    outcome: PolicyOutcome,
    messages_before: int,
    reads: LoopResult | None,
    messages_after: int | None = None,
    offloaded_bytes: int | None = None,
    session_fork: dict[str, Any] | None = None,
    checkpoint_json: bytes | None = None,
) -> dict[str, Any]:
    """``messages_after`` and ``offloaded_bytes`` default to what ``outcome`` holds; the proxy
    passes them because it drops the view and the offloaded texts before the upstream wait;
    ``checkpoint_json``: the outcome's checkpoint as JSON, when the caller has it already.

    The keys and their order are the event's schema (version ``SCHEMA_VERSION``)."""
    facts = outcome.facts
    return {
        "schema_version": SCHEMA_VERSION,
        "event_id": new_event_id(),
        "time": time.time(),
        "request_id": request_id,
        "tenant": tenant,
        "session": session,
        "model": model if isinstance(model, str) else None,
        "mode": mode,
        "policy": policy,
        "policy_version": policy_version,
        "policy_config_hash": policy_hash,
        "mechanisms": list(outcome.mechanisms),
        "trigger": outcome.trigger,
        **_trigger_fields(facts.trigger),
        "tokens_before": outcome.tokens_before,
        "tokens_after": _tokens_after(outcome, reads),
        "messages_before": messages_before,
        "messages_after": (
            messages_after if messages_after is not None else _messages_after(outcome, messages_before)
        ),
        "handles_offloaded": sorted(outcome.offloads),
        "offloaded_bytes": offloaded_bytes if offloaded_bytes is not None else _offloaded_bytes(outcome),
        "checkpoint_dropped": facts.checkpoint_dropped,
        # A session forked from another (a parallel run of the task, an edited history).
        "session_fork": session_fork,
        "parent_range": _parent_range(facts.summary),
        "summary": _summary_record(facts.summary, outcome),
        "read_tool_output": _reads_record(reads),
        "details": {k: v for k, v in facts.to_event().items() if k not in ("summary", "trigger")},
        # Already JSON: embedded as it is encoded (msgspec writes ``Raw`` verbatim), not decoded
        # into objects only to be encoded again when the event is written.
        "checkpoint": msgspec.Raw(
            encode_checkpoint(outcome.checkpoint) if checkpoint_json is None else checkpoint_json
        ),
        "view": _compressed_view(outcome),
        # The session's request number (the checkpoint counts them; null for a policy that
        # keeps no session state), and at a compaction point which client message each view
        # message is (-1: one the policy inserted): the session page's timeline and diff.
        "request": outcome.checkpoint.requests or None,
        "view_origin": list(outcome.origin) if outcome.trigger and outcome.origin is not None else None,
    }


class CheckpointJson:
    """Each session's checkpoint for its events, encoded once per change.

    Between compaction points a session's checkpoint changes only its request counter: the
    checkpoint is encoded with a sentinel counter (its template, named by a digest) when
    anything else changed, and each event's state pairs that template with its own count.
    Bounded to the ``sessions`` most recently seen."""

    def __init__(self, sessions: int = 1024) -> None:
        self.sessions = sessions
        self._templates: OrderedDict[str, tuple[Checkpoint, bytes, str]] = OrderedDict()

    def state(self, session: str, checkpoint: Checkpoint) -> CheckpointState | None:
        """This request's checkpoint as a template and a count; None when the encoder's
        layout has no single place for the count (the caller encodes it whole)."""
        found = self._templates.get(session)
        if found is None or not found[0].same_but_requests(checkpoint):
            template_of = checkpoint.with_requests(SENTINEL_REQUESTS)
            data = encode_checkpoint(template_of)
            if data.count(SENTINEL_JSON) != 1:
                return None
            found = self._templates[session] = (template_of, data, template_digest(data))
            while len(self._templates) > self.sessions:
                self._templates.popitem(last=False)
        self._templates.move_to_end(session)
        return CheckpointState(digest=found[2], template=found[1], requests=checkpoint.requests)

    def encode(self, session: str, checkpoint: Checkpoint) -> bytes:
        return checkpoint_json(checkpoint, self.state(session, checkpoint))


def checkpoint_json(checkpoint: Checkpoint, state: CheckpointState | None) -> bytes:
    """The event's checkpoint as JSON: filled in from its template, else encoded whole."""
    return encode_checkpoint(checkpoint) if state is None else state.json()


def _trigger_fields(trigger: TriggerFact | None) -> dict[str, Any]:
    """The trigger's threshold, window and thrashing limit; all ``None`` when none was measured."""
    return {
        "threshold": trigger.threshold if trigger else None,
        "window": trigger.window if trigger else None,
        "limited": trigger.limited if trigger else None,
    }


def _tokens_after(outcome: PolicyOutcome, reads: LoopResult | None) -> int:
    """What the upstream really received at most: a read round can be larger than the view."""
    if reads is None:
        return outcome.tokens_after
    return max(outcome.tokens_after, reads.largest_request)


def _messages_after(outcome: PolicyOutcome, messages_before: int) -> int:
    """The view's length; the client's when the request went upstream unchanged."""
    return len(outcome.messages) if outcome.messages is not None else messages_before


def _offloaded_bytes(outcome: PolicyOutcome) -> int:
    return sum(len(o.content.encode("utf-8", "replace")) for o in outcome.offloads.values())


def _parent_range(summary: SummaryFact | None) -> dict[str, Any] | None:
    """The client's messages a summary made at this request covers, and their digest."""
    if summary is None:
        return None
    return {"messages": list(summary.covered), "digest": summary.covered_digest}


def _summary_record(summary: SummaryFact | None, outcome: PolicyOutcome) -> dict[str, Any] | None:
    """The summary made at this request: a hash of its text (never the text), who wrote it and
    at what cost."""
    if summary is None:
        return None
    summary_message = outcome.checkpoint.summary
    summary_text = summary_message.get("content") if summary_message else None
    return {
        "hash": hashlib.blake2b(str(summary_text).encode(), digest_size=16).hexdigest()
        if summary_text
        else None,
        "model": summary.model,
        "prompt_family": summary.prompt_family,
        "prompt_version": summary.prompt_version,
        "input_tokens": summary.input_tokens,
        "output_tokens": summary.output_tokens,
        "seconds": summary.seconds,
        "fallback_reason": summary.fallback_reason,
        # A summary prepared ahead: used, none_ready, stale or rejected: <why>.
        "prepared": summary.prepared,
    }


def _reads_record(reads: LoopResult | None) -> dict[str, Any] | None:
    """The read_tool_output rounds answered inside the proxy for this request."""
    if reads is None:
        return None
    return {
        "rounds": reads.rounds,
        "reads": list(reads.reads),
        "usage_per_round": list(reads.usage_per_round),
        # Prompt tokens of every request sent upstream for this client request (proxy count).
        "tokens_per_round": list(reads.round_tokens),
        "bytes_read": reads.bytes_read,
        # Earlier results shortened, then withdrawn, to make room for later reads.
        "shrunk": reads.shrunk,
        "withdrawn": reads.withdrawn,
    }


def _compressed_view(outcome: PolicyOutcome) -> str | None:
    """At a compaction point the view itself (zlib, base64): the event alone then holds exactly
    what was sent; between points, checkpoint + the client's history rebuild it. Level 1: about
    four times faster than the default on agent text, for a somewhat larger event (it is
    written on the request's path of every compaction point)."""
    if outcome.trigger and outcome.messages is not None:
        return base64.b64encode(zlib.compress(orjson.dumps(outcome.messages), 1)).decode()
    return None


QueueEvent = Callable[[str, str, dict[str, Any], "CheckpointState | None"], "asyncio.Future[None]"]


class EventSink:
    """Writes events in the background: to the store, and to a JSON-lines file if set. Each
    write fails alone (a full disk under the file still leaves the event in the store, and the
    other way round); a failure is logged and counted (``on_failure``), never a failed request,
    and a line the disk had no room for is taken back whole, so the file never holds half an
    event that the next line would run into."""

    def __init__(
        self,
        store: Store,
        jsonl_path: str | None,
        logger: Any = None,
        on_failure: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.path = Path(jsonl_path) if jsonl_path else None
        self.log = logger or structlog.get_logger("compaction_proxy")
        self.on_failure = on_failure or (lambda: None)
        self.pending: set[asyncio.Future[None]] = set()
        self._file_lock = threading.Lock()  # one append at a time: a rollback cuts only its own
        # A store that batches events takes one without a task of its own per event.
        self._queue: QueueEvent | None = getattr(store, "queue_event", None)

    def emit(self, event: Mapping[str, Any], checkpoint: CheckpointState | None = None) -> None:
        """Write ``event`` in the background; ``checkpoint``: the state its checkpoint was
        made from, for a store that keeps each template once (the file gets it whole)."""
        if self._queue is not None and self.path is None:
            try:
                written = self._queue(event["tenant"], event["session"], dict(event), checkpoint)
            except Exception as exc:  # an event lost is logged, never a failed request
                self._failed("store", exc)
                return
            written.add_done_callback(self._batch_written)  # once per event: each failure counts
            self._wait_for(written)
            return
        self._wait_for(asyncio.ensure_future(self._write(dict(event), checkpoint)))

    def _wait_for(self, future: asyncio.Future[None]) -> None:
        if future not in self.pending:
            self.pending.add(future)
            future.add_done_callback(self.pending.discard)

    def _batch_written(self, written: asyncio.Future[None]) -> None:
        error = None if written.cancelled() else written.exception()
        if isinstance(error, Exception):  # a cancelled write (shutdown) is not a failure
            self._failed("store", error)

    async def _write(self, event: dict[str, Any], checkpoint: CheckpointState | None) -> None:
        try:
            await self.store.add_event(event["tenant"], event["session"], event, checkpoint)
        except Exception as exc:  # an event lost is logged, never a failed request
            self._failed("store", exc)
        if self.path is None:
            return
        try:
            await asyncio.to_thread(self._append, msgspec.json.encode(event) + b"\n")
        except Exception as exc:
            self._failed("file", exc)

    def _failed(self, where: str, exc: Exception) -> None:
        self.on_failure()
        self.log.warning("event_write_failed", where=where, error=type(exc).__name__)

    def _append(self, line: bytes) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._file_lock:
            self._append_locked(line)

    def _append_locked(self, line: bytes) -> None:
        assert self.path is not None
        # Events hold views (content): the file is created owner-only.
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            size = os.fstat(descriptor).st_size
            written = 0
            try:
                while written < len(line):
                    written += os.write(descriptor, line[written:])
            except OSError:
                os.ftruncate(descriptor, size)  # no partial line left behind
                raise
        finally:
            os.close(descriptor)

    async def drain(self) -> None:
        await asyncio.gather(*self.pending, return_exceptions=True)
