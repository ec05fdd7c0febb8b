"""A compacting route: a request of a dialect the proxy compacts, from its bytes to its answer.

The request goes through ordered steps with one signature (``Step``), each reading what the
earlier ones wrote on the request's ``Draft``: choose the policy and mode (from the headers or
the configuration), read the body into the neutral conversation (the dialect's ``restore``
hook first; a worker process reads a large body), let an agent's own compaction request pass,
compact (the compaction service makes the view), render the view in the dialect, and plan its
delivery. A step that returns False ends the preparation: the request then goes as it is,
which for every step before the view is the client's own bytes. The request is delivered as a
plain relay, or through the ``read_tool_output`` loop when the view names a saved output.
While the upstream works only the body sent is held (and, bounded, each conversation's last).

Nothing here knows a wire format: a dialect's own needs (hidden read rounds, headers a body
needs upstream) are hooks of its adapter (``dialects/base.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.handles import names_a_handle
from policies.pipeline import Policy, requested_answer_tokens
from policies.tokens import TokenCounter
from proxy.canary.runtime import CanaryArms, place_in_arm
from proxy.dialects.agent_compaction import agent_compaction, passes_as_sent
from proxy.dialects.base import Dialect
from proxy.dialects.doors import BODY_SAYS, Target
from proxy.read_loop.runner import LoopPlan, LoopRunner
from proxy.route.body_reading import read_body
from proxy.route.compact_answer import CompactAnswers, Taken
from proxy.route.compaction import CompactionService, policy_reserve
from proxy.route.delivery import deliver, deliver_held
from proxy.route.draft import (
    HEAD_LIMIT,
    UNREADABLE,
    Draft,
    Headers,
    Send,
    Step,
    restore_lookup,
    several_streamed_choices,
    why_unreadable,
)
from proxy.route.facts import compaction_attributes, record_compaction
from proxy.route.large_compaction import compact_large
from proxy.route.windows import WindowLearning
from proxy.route.wire_bytes import view_encoder
from proxy.state.sessions import tenant_of
from proxy.state.token_factors import ScaledWindows
from proxy.telemetry.compaction_cost import PreparedFor
from proxy.telemetry.exchange import Exchange, ShadowCompare
from proxy.telemetry.metrics import Metrics
from proxy.telemetry.shadow import ShadowComparer
from proxy.upstream.pool import Upstream
from proxy.upstream.providers import Provider
from proxy.upstream.relay import Held
from proxy.wire.errors import ProxyError
from proxy.wire.forwarding import header_value
from proxy.wire.json_body import SentAsIs

MODES = ("enforce", "shadow", "canary", "off")


class CompactingRoute:
    def __init__(
        self,
        *,
        dialects: Mapping[str, Dialect],
        policies: Mapping[str, Policy],
        default_policy: str,
        default_mode: str,
        service: CompactionService,
        counter: TokenCounter,
        windows: ScaledWindows,
        upstream: Upstream,
        metrics: Metrics,
        shadow: ShadowComparer,
        loops: LoopRunner,
        read_max_lines: int,
        canary: CanaryArms | None = None,
        learning: WindowLearning | None = None,
        compact_answers: CompactAnswers | None = None,
    ) -> None:
        self.dialects = dialects
        self.policies = policies
        self.default_policy = default_policy
        self.default_mode = default_mode
        self.service = service
        self.counter = counter
        self.windows = windows
        self.upstream = upstream
        self.metrics = metrics
        self.shadow = shadow
        self.loops = loops
        self.read_max_lines = read_max_lines
        self.canary = canary
        self.learning = learning
        self.compact_answers = compact_answers
        self._valid_policies = ", ".join(sorted(policies))
        self.steps: tuple[Step, ...] = (
            self.choose,
            self.read,
            self.assign_arm,
            *((learning.ask,) if learning is not None else ()),
            self.let_agent_compaction_pass,
            self.compact,
            self.render,
            self.plan,
        )

    def draft(
        self,
        dialect: str,
        headers: Headers,
        content: bytes,
        url: str,
        exchange: Exchange,
        provider: Provider,
        target: Target = BODY_SAYS,
    ) -> Draft:
        """``target``: what the request's path says (a Gemini door's model and stream)."""
        draft = Draft(
            self.dialects[dialect].at(target), provider, headers, url, exchange, content, target=target
        )
        draft.counter = self.counter.for_request()
        return draft

    async def handle(self, send: Send, draft: Draft) -> None:
        if self.compact_answers is not None:
            # Remote compaction answered, or the proxy's compaction items put back (before any
            # step reads the body: everything after sees, and sends, what they stand for).
            taken = await self.compact_answers.take(send, draft, self.choose)
            if taken is not Taken.GO_ON:
                if taken is Taken.AS_SENT:
                    await self._deliver(send, draft, again=False)
                return
        # A request the upstream refuses as over the window is compacted again from the
        # client's bytes (``route/windows.py``): kept while they are what goes upstream anyway,
        # or while the model's window is a guess; otherwise only the view is held during the wait.
        original: bytes | None = draft.content
        await self._prepared(draft)
        learning = self.learning
        if draft.content is not original and (
            learning is None or not learning.guessing(draft.exchange.model)
        ):
            original = None
        held = await self._deliver(send, draft, again=original is not None)
        if held is None or original is None or learning is None:
            return
        again = await self._prepared(
            self.draft(
                draft.dialect.name,
                draft.headers,
                original,
                draft.url,
                draft.exchange,
                draft.provider,
                draft.target,
            )
        )
        original = None
        if learning.fits(again.exchange):
            await self._deliver(send, again, again=False)
            return
        # Even compacted to the window it named, the request would not fit (a single message
        # larger than the window): the upstream's own refusal is the answer.
        again.exchange.context_retry = None
        await deliver_held(send, held, draft)

    async def _prepared(self, draft: Draft) -> Draft:
        for step in self.steps:
            if not await step(draft):
                break
        return draft

    async def _deliver(self, send: Send, draft: Draft, *, again: bool) -> Held | None:
        """The prepared request upstream and its answer to the client; the answer held back
        when the upstream refused it as over the window and it is to be compacted ``again`` to
        the window it named."""
        learning = self.learning
        refused = (
            learning.refusal(draft, again=again) if learning is not None and draft.mode != "off" else None
        )
        return await deliver(
            send, draft, upstream=self.upstream, metrics=self.metrics, loops=self.loops, refused=refused
        )

    async def choose(self, draft: Draft) -> bool:
        """The policy and mode: the request's headers, else the configuration."""
        requested = header_value(draft.headers, b"x-compaction-policy")
        name = requested.decode("latin-1") if requested else self.default_policy
        policy = self.policies.get(name)
        if policy is None:
            message = f"Unknown compaction policy {name!r}. Valid policies: {self._valid_policies}."
            raise ProxyError(400, message, code="unknown_policy", param="X-Compaction-Policy")
        requested_mode = header_value(draft.headers, b"x-compaction-mode")
        mode = requested_mode.decode("latin-1") if requested_mode else self.default_mode
        if mode not in MODES:
            message = f"Unknown compaction mode {mode!r}. Valid modes: {', '.join(MODES)}."
            raise ProxyError(400, message, code="unknown_mode", param="X-Compaction-Mode")
        exchange = draft.exchange
        exchange.mode = mode
        exchange.policy = name if mode != "off" else "off"
        draft.policy, draft.mode = policy, mode
        draft.route_headers += [
            (b"x-compaction-policy", exchange.policy.encode()),
            (b"x-compaction-mode", mode.encode()),
        ]
        draft.tenant = tenant_of(draft.headers)
        exchange.client_session = header_value(draft.headers, b"x-session-id")
        return mode != "off"

    async def read(self, draft: Draft) -> bool:
        """The body parsed from where it stops repeating the conversation's last one (a large
        one is left to a worker process, in ``compact``) and read by the dialect. An unreadable
        body goes as sent, never a 500: the upstream's own error answers it."""
        large = self.service.large
        if large.wants(draft.content):
            return True
        trace = draft.exchange.trace
        phase = trace.phase("parse", {"compaction.body_bytes": len(draft.content)}) if trace else None
        try:
            return await read_body(draft, self.service.bodies, large)
        finally:
            if phase is not None:
                phase.end()

    async def assign_arm(self, draft: Draft) -> bool:
        """Canary mode: the session's arm. The holdout goes as the client sent it (as ``full``
        forwards it); the treated arm is compacted as in enforce mode."""
        if draft.mode != "canary":
            return True
        parsed, exchange = draft.parsed, draft.exchange
        neutral = parsed.neutral if parsed is not None else None
        marker = draft.dialect.tool_call_marker
        arm = await place_in_arm(self.canary, exchange, draft.headers, draft.tenant, neutral, marker)
        draft.route_headers.append((b"x-compaction-arm", arm.encode()))
        if arm == "holdout":
            exchange.policy = "off"
            draft.parsed = None
            return False
        draft.mode = exchange.mode = "enforce"
        return True

    async def let_agent_compaction_pass(self, draft: Draft) -> bool:
        """The agent's own compaction request goes as sent when it fits the window (see
        ``proxy/dialects/agent_compaction.py``); the decision is noted for the event."""
        parsed = draft.parsed
        if parsed is None or draft.skipped:
            return True
        messages, wire = parsed.neutral["messages"], draft.wire
        # Where the neutral messages are the body's own list (the chat door), the body reader
        # knows the last user message; elsewhere the history is scanned.
        last_user = wire.last_user() if wire is not None and wire.items is messages else None
        agent = agent_compaction(draft.headers, messages, last_user)
        if agent is None:
            return True
        neutral = parsed.neutral
        tokens = (draft.counter or self.counter).count_request(neutral).total
        window = self.windows.window_for(neutral.get("model"))
        reason, note = passes_as_sent(agent, tokens, window, requested_answer_tokens(neutral))
        parsed.notes["agent_compaction"] = note
        if reason:
            draft.skipped = reason
        return True

    async def compact(self, draft: Draft) -> bool:
        """The compaction service makes the view (for a large body, in a worker process)."""
        trace = draft.exchange.trace
        phase = trace.phase("compaction") if trace else None
        try:
            return await self._compact(draft)
        finally:
            if phase is not None:
                phase.end(**compaction_attributes(draft.exchange))

    async def _compact(self, draft: Draft) -> bool:
        assert draft.policy is not None
        # The client's credential is for the provider its request addressed, and only there;
        # the operator's key (the provider's fallback) pays only for a client that sends none.
        base = draft.provider.base
        origin = (base.scheme, base.host, base.port)
        parsed = draft.parsed
        if parsed is None:
            try:
                compacted = await compact_large(
                    self.service,
                    draft.content,
                    dialect=draft.dialect.name,
                    policy=draft.policy,
                    tenant=draft.tenant,
                    headers=draft.headers,
                    client_origin=origin,
                    restore=restore_lookup(draft),
                    fallback=draft.provider.fallback,
                    target=draft.target,
                    whose=PreparedFor.of(draft.exchange),
                )
            except (SentAsIs, *UNREADABLE) as exc:
                return draft.as_sent(why_unreadable(draft.dialect.name, exc))
        else:
            compacted = await self.service.compact(
                parsed.neutral,
                policy=draft.policy,
                tenant=draft.tenant,
                headers=draft.headers,
                skipped=draft.skipped,
                client_origin=origin,
                counter=draft.counter,
                fallback=draft.provider.fallback,
                door=draft.dialect.name,
                whose=PreparedFor.of(draft.exchange),
            )
            compacted.stream, compacted.notes = parsed.stream, parsed.notes
        draft.compacted = compacted
        draft.marked = draft.marked or compacted.marked
        exchange = draft.exchange
        record_compaction(exchange, compacted, draft.tenant, draft.route_headers)
        if self.windows.factors.default_for(exchange.model) is not None:
            # A model counted with a factor: its answer's reported prompt tokens calibrate it.
            exchange.token_factor = self.windows.factors.factor(exchange.model)
            exchange.head_limit = HEAD_LIMIT
        return True

    async def render(self, draft: Draft) -> bool:
        """The view as the dialect's wire body (a worker process rendered a large one)."""
        compacted = draft.compacted
        assert compacted is not None
        outcome = compacted.outcome
        draft.view = compacted.view_body
        if draft.view is None and outcome.messages is not None and draft.parsed is not None:
            draft.view = draft.dialect.render(draft.parsed, outcome.messages, outcome.origin or ())
        if draft.view is None and draft.restored is not None and draft.mode == "enforce":
            # The policy changed nothing, but what the hook put back must reach the upstream.
            draft.view = draft.restored
        return draft.view is not None

    async def plan(self, draft: Draft) -> bool:
        """How the view goes: compared in the background (shadow), through the read loop when
        it names a saved output, else relayed."""
        compacted, view, exchange = draft.compacted, draft.view, draft.exchange
        assert compacted is not None and view is not None and draft.policy is not None
        if draft.mode == "shadow":
            if self.shadow.wanted():
                headers = draft.provider.upstream_headers(draft.headers)
                exchange.compare = ShadowCompare(
                    body=view,
                    url=draft.dialect.json_url(draft.url),
                    headers=headers,
                    dialect=draft.dialect.name,
                    target=draft.target,
                )
            draft.view = None  # the client's bytes go
            return False
        outcome = compacted.outcome
        encode = view_encoder(draft.wire, verify=self.service.bodies.verify, marked=draft.marked)
        if (
            outcome.messages is not None
            and outcome.checkpoint.handles  # cheap: no handle issued, none to find in the view
            and names_a_handle(outcome.messages)
            and not several_streamed_choices(view)
        ):
            requested = draft.dialect.answer_tokens(view)
            draft.loop = LoopPlan(
                draft.dialect.with_read_tool(view, self.read_max_lines),
                window=self.windows.window_for(compacted.model),
                reserve=max(policy_reserve(draft.policy), requested),
                requested=requested,
                handles=tuple(outcome.checkpoint.handles),
                counter=draft.counter,
                encode=encode,
            )
            draft.view, draft.content = draft.loop.body, b""
            return True
        draft.content = encode(view)
        return True
