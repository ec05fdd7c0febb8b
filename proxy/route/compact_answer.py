"""Remote compaction answered by the proxy, and its items put back in later requests.

A Responses request that asks for a compaction (``POST /v1/responses/compact``, or an
``input`` with a ``compaction_trigger`` item: Codex CLI's remote compaction v2) is answered
here when ``compact.answer`` says the proxy answers (every upstream but OpenAI's, by default):
the compaction service runs the request's policy over its ``input`` at a forced compaction
point, what the view keeps besides the messages the client keeps itself (the summary and its
ledger, the retained tail) is stored under a record id, and the answer is one ``compaction``
item naming the record, signed with the client's tenant (``dialects/responses_compaction.py``).
The item in a later request's ``input`` is verified and replaced by those items before
anything else reads the body, so the upstream never sees an item it does not know; one that
does not verify, or names a record the store does not have, is refused with a 400 that says
why. With ``compact.answer: relay`` a compaction request goes upstream as it came.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any, Literal

import orjson

from policies.pipeline import Offload
from proxy.dialects import responses_compaction as rc
from proxy.route.compaction import CompactionService
from proxy.route.draft import Draft, Send
from proxy.route.facts import record_compaction
from proxy.state.sessions import tenant_of
from proxy.state.store import Store
from proxy.telemetry.metrics import Metrics
from proxy.wire.errors import ProxyError
from proxy.wire.response_writer import ResponseWriter

SECRET_NAME = "compaction_items"  # noqa: S105 (the name the store keeps the key under)
RECORDS_KEPT = 1024  # records read back, per process: an agent sends its item on every request


class Taken(Enum):
    GO_ON = "go on"  # the route's steps, on the body (its items put back)
    ANSWERED = "answered"
    AS_SENT = "as sent"  # relayed untouched (``compact.answer: relay`` at the compact endpoint)


class CompactAnswers:
    def __init__(
        self,
        *,
        answer: Literal["proxy", "relay"],
        service: CompactionService,
        store: Store,
        metrics: Metrics,
        secret: str | None = None,
    ) -> None:
        """``secret``: the configured key (``compact.secret``); None: the store's."""
        self.answer = answer
        self.service = service
        self.store = store
        self.metrics = metrics
        self._secret = secret.encode() if secret else None
        self._records: OrderedDict[tuple[str, str], list[Any]] = OrderedDict()

    async def secret(self) -> bytes:
        if self._secret is None:
            try:
                self._secret = await self.store.secret(SECRET_NAME, secrets.token_bytes(32))
            except Exception:
                self.metrics.errors.labels("store_read").inc()
                raise _store_down() from None
        return self._secret

    async def take(self, send: Send, draft: Draft, choose: Callable[[Draft], Awaitable[bool]]) -> Taken:
        """Answer ``draft`` when it asks for a compaction the proxy answers; else put its items
        back (``draft.content`` then holds the body with them) and say how it goes on.
        ``choose``: the route's step that picks the policy and the tenant."""
        remote = draft.dialect.remote_compaction
        # Both names hold `"compaction`: a body without it is read by nothing here.
        if remote is None or (not remote.endpoint and b'"compaction' not in draft.content):
            return Taken.GO_ON
        try:
            body = orjson.loads(draft.content)
        except orjson.JSONDecodeError:
            return Taken.AS_SENT if remote.endpoint else Taken.GO_ON  # the upstream's own error
        if not isinstance(body, dict):
            return Taken.AS_SENT if remote.endpoint else Taken.GO_ON
        if isinstance(body.get("input"), str):
            body["input"] = [{"type": "message", "role": "user", "content": body["input"]}]
        items = body.get("input")
        items = items if isinstance(items, list) else []
        found = await self._put_back(items, tenant_of(draft.headers))
        expanded = rc.put_back(items, found) if found else None
        if expanded is not None:
            body["input"] = expanded
        if remote.wanted(body) and self.answer == "proxy":
            await choose(draft)
            # What an earlier item stood for is the proxy's, not the client's: a new record
            # keeps it even where it is a user message (the client does not have it).
            ours = {id(i) for put in found.values() for i in put}
            await self._answer(send, draft, body, remote.endpoint, ours)
            return Taken.ANSWERED
        if expanded is not None:
            draft.content = orjson.dumps(body)
        if remote.endpoint:
            draft.as_sent("compact.answer: relay")
            return Taken.AS_SENT
        return Taken.GO_ON

    async def _put_back(self, items: list[Any], tenant: str) -> dict[int, list[Any]]:
        """What each of the proxy's compaction items in ``items`` stands for, by position.
        Another's ``compaction`` item goes on only to OpenAI, which made it."""
        found: dict[int, list[Any]] = {}
        for position, item in enumerate(items):
            if not rc.is_item(item) or (self.answer == "relay" and not rc.is_ours(item)):
                continue
            try:
                record = rc.record_of(item, tenant, await self.secret())
                found[position] = await self._record(tenant, record)
            except ProxyError as error:
                if error.status == 400:
                    self.metrics.remote_compactions.labels("refused").inc()
                raise
        if found:
            self.metrics.remote_compactions.labels("expanded").inc(len(found))
        return found

    async def _record(self, tenant: str, record: str) -> list[Any]:
        key = (tenant, record)
        kept = self._records.get(key)
        if kept is None:
            try:
                stored = await self.store.get_output(tenant, record)
            except Exception:
                self.metrics.errors.labels("store_read").inc()
                raise _store_down() from None
            if stored is None:
                raise rc.refused("names a compaction this proxy does not have (its store was replaced?)")
            if stored.content is None:
                raise rc.refused("names a compaction that expired (store.keep_days after its last use)")
            kept = rc.items_of(stored.content)
            self._keep(key, kept)
        self._records.move_to_end(key)
        return kept

    def _keep(self, key: tuple[str, str], items: list[Any]) -> None:
        self._records[key] = items
        while len(self._records) > RECORDS_KEPT:
            self._records.popitem(last=False)

    async def _answer(
        self, send: Send, draft: Draft, body: dict[str, Any], endpoint: bool, ours: set[int]
    ) -> None:
        """The request's policy at a forced compaction point; its record stored; the answer.
        ``ours``: the ids of the input's items an earlier record put back."""
        assert draft.policy is not None
        request = {**body, "input": rc.without_trigger(body["input"])}
        parsed = draft.dialect.parse(request)
        if parsed.skipped:
            message = f"The proxy compacts the history in 'input' only ({parsed.skipped})."
            raise ProxyError(400, message, code="unsupported_compaction")
        base = draft.provider.base
        compacted = await self.service.compact(
            parsed.neutral,
            policy=draft.policy,
            tenant=draft.tenant,
            headers=draft.headers,
            skipped=None,
            client_origin=(base.scheme, base.host, base.port),
            counter=draft.counter,
            fallback=draft.provider.fallback,
            force=True,
        )
        outcome = compacted.outcome
        kept = rc.stands_for(parsed.neutral["messages"], parsed.private, request["input"], outcome, ours)
        record = rc.new_record()
        items = draft.dialect.render(parsed, [m for m, _ in kept], [o for _, o in kept])["input"]
        try:
            # Durably stored before the item that names it is answered.
            kept_as = Offload(record, rc.record_content(items), "compaction")
            await self.store.put_outputs(draft.tenant, [kept_as])
        except Exception:
            self.metrics.errors.labels("store_write").inc()
            raise _store_down() from None
        self._keep((draft.tenant, record), items)
        counter = draft.counter or self.service.counter
        stands = sum(counter.count_messages([m for m, _ in kept], counter.encoding_for(compacted.model)))
        how = "endpoint" if endpoint else "trigger"
        compacted.stream = parsed.stream and not endpoint
        compacted.notes = {**parsed.notes, "remote_compaction": {"answered": how, "items": len(items)}}
        exchange = draft.exchange
        record_compaction(exchange, compacted, draft.tenant, draft.route_headers)
        answer = rc.Answer(
            body=request,
            item=rc.item(record, rc.seal(record, draft.tenant, await self.secret())),
            usage=rc.usage(compacted.outcome.tokens_before, stands),
        )
        self.metrics.remote_compactions.labels(how).inc()
        users = [i for i in rc.user_messages(request["input"]) if id(i) not in ours]
        await _write(send, draft, answer, endpoint, parsed.stream, users)


async def _write(
    send: Send, draft: Draft, answer: rc.Answer, endpoint: bool, stream: bool, kept: list[Any]
) -> None:
    exchange = draft.exchange
    writer = ResponseWriter(
        send,
        extra_headers=[*draft.route_headers, *exchange.extra_headers],
        error_body=draft.provider.error_body,
        mark_done=exchange.mark_responded,
    )
    exchange.status = 200
    if stream and not endpoint:
        events = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
        writer.start(200, events, streaming=True)
        await writer.finish(answer.events())
        return
    body = answer.compacted(kept) if endpoint else answer.response()
    await writer.respond(200, [(b"content-type", b"application/json")], orjson.dumps(body))


def _store_down() -> ProxyError:
    return ProxyError(
        503,
        "The proxy's store is unavailable: the compaction could not be kept or read.",
        code="store_unavailable",
    )
