"""A large request's compaction: read, counted and compacted in a worker process.

The same service and session steps as a request of ordinary size (``compaction.py``): the
worker inspects the body (its model, its session's root and digests, what an agent's own
compaction asked), the policy runs there from the session's checkpoint, and the view comes
back rendered as the dialect's body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from policies.pipeline import Checkpoint, Policy, PolicyOutcome
from policies.prompt_cache import PromptCache
from proxy.dialects.agent_compaction import passes_as_sent
from proxy.dialects.doors import BODY_SAYS, Target
from proxy.route.compaction import Compacted, CompactionService, Fallback, Headers, Origin, without_stages
from proxy.route.large_requests import LargeWorker
from proxy.summaries.credentials import SummaryCredential
from proxy.telemetry.compaction_cost import PreparedFor
from proxy.wire.errors import ProxyError
from proxy.wire.forwarding import header_value


async def compact_large(
    service: CompactionService,
    body: bytes,
    *,
    dialect: str,
    policy: Policy,
    tenant: str,
    headers: Headers,
    client_origin: Origin | None = None,
    restore: Callable[[list[Any]], Awaitable[Any]] | None = None,
    fallback: Fallback | None = None,
    target: Target = BODY_SAYS,
    whose: PreparedFor | None = None,
) -> Compacted:
    """A large body: read, counted and compacted in a worker process (held for every phase:
    it keeps the parsed body between them). ``restore``: the dialect's lookup of what its
    ``restore`` hook puts back, when it could put anything back (it holds the state);
    ``target``: what the request's path says, which the worker binds its adapter to."""
    async with service.large.worker() as worker:
        return await _compact_in(
            service,
            worker,
            body,
            dialect,
            target,
            policy,
            tenant,
            headers,
            service.credential(headers, client_origin, fallback),
            restore,
            whose,
        )


async def _compact_in(
    service: CompactionService,
    worker: LargeWorker,
    body: bytes,
    dialect: str,
    target: Target,
    policy: Policy,
    tenant: str,
    headers: Headers,
    credential: SummaryCredential,
    restore: Callable[[list[Any]], Awaitable[Any]] | None,
    whose: PreparedFor | None,
) -> Compacted:
    explicit = header_value(headers, b"x-session-id")
    inspected = await worker.inspect(
        body,
        dialect,
        target,
        tenant,
        with_digests=service.keeps_session_state(policy) and not explicit,
        headers=headers,
        restore=restore,
    )
    if inspected.error is not None:
        status, message, param = inspected.error
        raise ProxyError(status, message, param=param)
    model = inspected.model
    skipped, notes = inspected.skipped, dict(inspected.notes)
    if inspected.agent is not None:
        window = service.windows.window_for(model)
        skipped, notes["agent_compaction"] = passes_as_sent(
            inspected.agent, inspected.agent_tokens, window, inspected.requested
        )
    skip = skipped is not None
    effective = without_stages(policy) if skip else policy
    resolution = (
        await service.checkpoints.resolve(headers, inspected.root, tenant, policy.name, inspected.digests)
        if service.keeps_session_state(effective)
        else None
    )
    session = resolution.session + ":" + policy.name if resolution else ""
    encoding = service.counter.encoding_for(model)
    window = service.windows.window_for(model)
    compacted = Compacted(
        outcome=PolicyOutcome(None, 0, 0),
        session=session,
        messages=inspected.messages,
        model=model,
        skipped=skipped,
        stream=inspected.stream,
        notes=notes,
        marked=inspected.marked,
        whose=whose,
    )

    async def compute(
        checkpoint: Checkpoint | None, summarizer: Any, cache: PromptCache | None = None
    ) -> PolicyOutcome:
        computed = await worker.apply(
            policy=policy.name,
            window=window,
            checkpoint=checkpoint,
            injected_tokens=service.injected_tokens(encoding),
            session=session,
            credential=credential,
            skip=skip,
            cache=cache,
        )
        outcome, compacted.view_body = computed.outcome()
        return outcome

    compacted.outcome = await service.apply(
        effective, headers, tenant, session, resolution, compacted, compute, credential, door=dialect
    )
    return compacted
