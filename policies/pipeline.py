"""The one entry point through which the proxy and the replay harness apply a policy.

A policy is a named, ordered list of stages built from configuration. Building rejects
unknown stages and bad stage settings, so a typo stops the start instead of silently
compacting nothing.

Stages are small and deterministic. The only I/O a stage may do goes through the
interfaces in ``Context`` (the summarizer), so every stage is testable without a network.

A session's state between requests is a ``Checkpoint``: it goes in with the request and
comes back out. Its decisions are *sticky*: the summary, the placeholders and the dropped
messages of earlier requests are re-applied byte for byte before any stage runs, so
between two compactions the prefix the upstream sees only grows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import re2

from policies.conversation import Message, parse
from policies.digests import Digests
from policies.facts import StageFacts
from policies.pins import Pins
from policies.prompt_cache import PromptCache
from policies.stages import STAGE_TYPES
from policies.sticky import apply_checkpoint
from policies.summarizer import Summarizer
from policies.tokens import REPLY_PRIMING, RequestTokens, TokenCounter
from policies.traits import PolicyTraits, policy_traits
from policies.view import Checkpoint, Context, Offload, Stage, View, requested_answer_tokens

__all__ = [
    "Checkpoint",
    "Context",
    "Offload",
    "Policy",
    "PolicyConfigError",
    "PolicyOutcome",
    "Stage",
    "View",
    "apply_checkpoint",
    "build_policies",
    "build_policy",
    "requested_answer_tokens",
]


class PolicyConfigError(ValueError):
    """A policy's configuration is unusable; the message names the policy and the stage."""


@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    """What a policy did to one request.

    ``messages`` is ``None`` when the request goes upstream unchanged, which lets the proxy
    forward the client's original bytes.
    """

    messages: list[Any] | None
    tokens_before: int
    tokens_after: int
    mechanisms: tuple[str, ...] = ()
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    facts: StageFacts = field(default_factory=StageFacts)
    offloads: Mapping[str, Offload] = field(default_factory=dict)
    # The client's messages, for ``problems()``: malformed input is reported on demand.
    original: Sequence[Message] = ()
    trigger: str | None = None
    # For each message of the view, the index of the client's message it is (or stands for:
    # a placeholder keeps its original's index), or -1 for one the policy inserted. A dialect
    # adapter uses it to send untouched items of its wire format exactly as they came.
    origin: tuple[int, ...] | None = None

    @property
    def changed(self) -> bool:
        return self.messages is not None

    def problems(self) -> tuple[str, ...]:
        """Protocol problems the client's own messages already had (no policy adds any)."""
        return parse(self.original).problems


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    description: str
    stages: tuple[Stage, ...]
    pins: Pins = field(default_factory=Pins)
    traits: PolicyTraits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "traits", policy_traits(self.stages))

    async def apply(
        self,
        body: Mapping[str, Any],
        counter: TokenCounter,
        *,
        window: int = 128_000,
        checkpoint: Checkpoint | None = None,
        summarizer: Summarizer | None = None,
        force: bool = False,
        digests: Digests | None = None,
        injected_tokens: int = 0,
        prepare: bool = False,
        cache: PromptCache | None = None,
    ) -> PolicyOutcome:
        """Compute the view of one chat request. Never raises on malformed messages: input
        problems are reported, and stages leave malformed parts as they are. ``force`` makes
        this request a compaction point whatever its size; ``prepare`` too, and its summarizing
        stage summarizes what a point would at this size even below its target (a dry run that
        prepares the next point's summary). ``injected_tokens``: what the proxy adds to a view
        that names a saved output, kept free by the token safeguard. ``cache``: the provider's
        prompt cache of the session's prefix (None: time-blind)."""
        counted = counter.count_request(body)
        messages = body.get("messages")
        checkpoint = checkpoint or Checkpoint()
        if not self.stages or not isinstance(messages, list):
            return PolicyOutcome(None, counted.total, counted.total, checkpoint=checkpoint)
        ctx = self._context(
            body,
            counter,
            counted,
            window=window,
            summarizer=summarizer,
            digests=digests or Digests(),
            injected_tokens=injected_tokens,
            preparing=prepare,
            cache=cache,
        )
        view = _request_view(messages, checkpoint, counted, force=force or prepare)
        apply_checkpoint(view, ctx.digests)
        _count_from_request(view, ctx, counted)
        for stage in self.stages:
            view = await stage.apply(view, ctx)
        if view.decided:
            view.checkpoint = _with_compaction_counted(view.checkpoint)
        if ctx.cache is not None and ctx.cache.cold:
            # Back after its cache expired: the provider writes the whole prefix anew.
            view.checkpoint = replace(view.checkpoint, prefix_written_at=view.checkpoint.requests)
        after = view.tokens(ctx) if view.changed else counted.total
        if after > counted.total:
            # A summary can outweigh a short history: never send more than the client did.
            return _reverted_outcome(view, checkpoint, counted.total, after)
        return PolicyOutcome(
            messages=view.messages if view.changed else None,
            tokens_before=counted.total,
            tokens_after=after,
            mechanisms=tuple(view.mechanisms),
            checkpoint=view.checkpoint,
            facts=view.facts,
            offloads=view.offloads,
            original=messages,
            trigger=view.trigger,
            origin=tuple(view.origin) if view.changed else None,
        )

    def _context(
        self,
        body: Mapping[str, Any],
        counter: TokenCounter,
        counted: RequestTokens,
        *,
        window: int,
        summarizer: Summarizer | None,
        digests: Digests,
        injected_tokens: int,
        preparing: bool = False,
        cache: PromptCache | None = None,
    ) -> Context:
        """What the stages share for one request (``traits``: what its stages tell every one)."""
        traits = self.traits
        return Context(
            counter=counter,
            encoding=counted.encoding,
            window=window,
            tools_tokens=counted.tools,
            summarizer=summarizer,
            model=body.get("model") if isinstance(body.get("model"), str) else None,
            pins=self.pins,
            digests=digests,
            answer_tokens=requested_answer_tokens(body),
            injected_tokens=injected_tokens,
            summarizes=traits.summarizes,
            ledger_share=traits.ledger_share,
            reserve_tokens=traits.reserve_tokens,
            read_room=traits.safeguard.read_room(window) if traits.safeguard is not None else 0,
            edit_artifacts=traits.edit_artifacts,
            transcripts=traits.transcripts,
            preparing=preparing,
            cache=cache,
        )


def _request_view(
    messages: list[Any], checkpoint: Checkpoint, counted: RequestTokens, *, force: bool
) -> View:
    """The view before any stage: the request itself (its token count already known), one
    more request counted in the session's checkpoint; ``force`` makes it a compaction point."""
    view = View(
        messages=list(messages),
        original=messages,
        origin=list(range(len(messages))),
        checkpoint=checkpoint.with_requests(checkpoint.requests + 1),
        compacting=force,
        trigger="forced" if force else None,
    )
    view._tokens = (view.messages, counted.total)
    return view


def _count_from_request(view: View, ctx: Context, counted: RequestTokens) -> None:
    """The token count of the view the checkpoint made, from the request's: each message it
    kept is the client's own object, counted already, and only what it put in (placeholders,
    the summary) is counted. The counter remembers the view's list, so the stages, the read
    loop and the session's record look its count up instead of walking it again."""
    original, per_message = view.original, counted.messages
    if not view.changed or len(per_message) != len(original):
        return
    count = ctx.counter.count_message
    counts = tuple(
        per_message[o] if o >= 0 and m is original[o] else count(m, ctx.encoding)
        for m, o in zip(view.messages, view.origin, strict=True)
    )
    ctx.counter.remember_list(view.messages, ctx.encoding, counts)
    view._tokens = (view.messages, sum(counts) + ctx.tools_tokens + REPLY_PRIMING)


def _with_compaction_counted(checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint after a compaction point at its current request: the count, and the last
    five points' request numbers (what thrash detection looks at)."""
    return replace(
        checkpoint,
        compactions=checkpoint.compactions + 1,
        recent_compactions=(*checkpoint.recent_compactions[-4:], checkpoint.requests),
    )


def _reverted_outcome(view: View, checkpoint: Checkpoint, tokens: int, view_tokens: int) -> PolicyOutcome:
    """The request goes out as the client sent it, with the session's checkpoint as it came in
    (``checkpoint``): the view came out larger (``view_tokens``) than the request (``tokens``)."""
    view.facts.reverted = f"view had {view_tokens} tokens, more than the request's {tokens}"
    return PolicyOutcome(
        None,
        tokens,
        tokens,
        checkpoint=checkpoint,
        facts=view.facts,
        original=view.original,
        # The client's request goes out as it is: a layout change, reported as such.
        trigger="reverted" if checkpoint.summary or checkpoint.placeholders or view.trigger else None,
    )


def _build_stage(policy: str, index: int, stage: object) -> Stage:

    if not isinstance(stage, Mapping) or len(stage) != 1:
        raise PolicyConfigError(
            f"policies.{policy}.stages[{index}]: each stage is a one-key mapping, "
            "e.g. `- n_latest: {n: 20}`"
        )
    ((stage_name, config),) = stage.items()
    stage_type = STAGE_TYPES.get(stage_name)
    if stage_type is None:
        raise PolicyConfigError(
            f"policies.{policy}.stages[{index}]: unknown stage {stage_name!r} "
            f"(known: {', '.join(sorted(STAGE_TYPES))})"
        )
    try:
        built: Stage = msgspec.convert(config or {}, stage_type, strict=True)
    except (msgspec.ValidationError, ValueError) as exc:
        raise PolicyConfigError(f"policies.{policy}.stages[{index}].{stage_name}: {exc}") from exc
    return built


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False
    options.max_mem = 8 << 20  # RE2 falls back to a slower, still linear engine past this
    return options


def build_pins(policy: str, tools: Sequence[str] = (), patterns: Sequence[str] = ()) -> Pins:
    r"""Pin patterns run on RE2, as reads do: linear time whatever the pattern, so a plausible
    ``^(\s*\w+)*:\s*Error`` cannot freeze the proxy; what RE2 cannot compile (backreferences,
    lookaround) stops the start with the policy and the pattern named."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re2.compile(pattern, _re2_options()))
        except re2.error as exc:
            detail = (
                exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            )
            raise PolicyConfigError(
                f"policies.{policy}.pins.patterns: {pattern!r} is not a valid RE2 regular expression "
                f"({detail}; no backreferences or lookaround)"
            ) from exc
    return Pins(tools=frozenset(tools), patterns=tuple(compiled))


def build_policy(
    name: str,
    description: str,
    stages: Sequence[object],
    safeguard: bool = True,
    pin_tools: Sequence[str] = (),
    pin_patterns: Sequence[str] = (),
) -> Policy:
    """``safeguard`` appends the final token safeguard unless the stages already end with one."""
    built = [_build_stage(name, index, stage) for index, stage in enumerate(stages)]
    if safeguard and built and built[-1].name != "token_safeguard":
        built.append(_build_stage(name, len(built), {"token_safeguard": {}}))
    pins = build_pins(name, pin_tools, pin_patterns)
    return Policy(name=name, description=description, stages=tuple(built), pins=pins)


PolicySpec = tuple[str, Sequence[object], bool, Sequence[str], Sequence[str]]


def build_policies(configs: Mapping[str, PolicySpec]) -> dict[str, Policy]:
    """``{name: (description, stages, safeguard, pin_tools, pin_patterns)}`` to built policies."""
    return {name: build_policy(name, *config) for name, config in configs.items()}
