"""Model summaries prepared ahead, so a compaction point never waits for the summarizer.

Two moments start a preparation, each off the request path (bounded per process and per
tenant, with the summarizer's timeout; a newer preparation of a session replaces an older one):

- a request passes the ``prepare_at`` mark (a share of the window, below the high-water mark):
  the policy runs once more in the background, as if this request were a compaction point,
  and the summary request it would make (the range the next point covers, at this size) goes
  to the summarizer;
- a compaction point finds nothing ready: the ledger alone is used now, and this point's range
  is summarized for the next point.

At a compaction point a prepared summary is used at once if it is **checked**: it starts where
this summary starts and covers a prefix of its range with the same digests (no branch, no
edit since), it names no saved-output handle and no file the ledger does not know, every
identifier it shares with the ledger is spelled as the ledger has it, and it fits the
summarizer's output budget. The steps after its end are in the ledger, which the stage
regenerates for the exact range and always appends. A summary that fails a check is dropped
and recorded (``prepared: rejected: <why>`` or ``stale`` in the event, and a metric).

A preparation pays with the credential of the request that started it (its summarizer's, see
credentials.py), and a prepared summary is served only to a request whose summary that same
credential would pay for (``payer``): one made with the operator's key never reaches a client
whose own key pays, nor the reverse.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import orjson

from policies.ledger import Ledger
from policies.pipeline import Checkpoint, PolicyOutcome
from policies.summarizer import Summarizer, SummaryRequest, SummaryResult
from policies.tokens import TokenCounter
from proxy.config.settings import Settings
from proxy.summaries.prepared_store import PreparedStore, make_prepared_store
from proxy.telemetry.metrics import Metrics

_HANDLE = re.compile(r"\bout_[0-9a-f]{16}\b")
# A path-like word: a file name with an extension, possibly under directories.
_FILE = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.(?:py|js|ts|tsx|go|rs|java|rb|c|h|cc|cpp|md|txt|json|yml|yaml|toml|cfg|ini|sh))\b"
)
# An exact identifier: a word with an underscore, a dot inside, or a lower-to-upper change
# (snake_case, module.attr, camelCase); plain words may be capitalized at will.
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


# The payer of a summarizer that carries no credential of its own (a test's, the ledger).
KEYLESS = "-"


def _identifiers(text: str) -> list[str]:
    return [w for w in _WORD.findall(text) if "_" in w or "." in w or re.search(r"[a-z][A-Z]", w)]


@dataclass(frozen=True, slots=True)
class Prepared:
    start: int
    digests: tuple[str, ...]
    result: SummaryResult
    made: float
    # The digest of the credential that paid (``SummaryCredential.payer``), never the key.
    payer: str = "unknown"


def known_names(ledger: Ledger) -> tuple[set[str], set[str], dict[str, str]]:
    """The handles, files and identifiers the ledger knows (identifiers by lower case)."""
    text = " ".join(
        [
            ledger.goal,
            *(f.path for f in ledger.files),
            *(c.command for c in ledger.commands),
            *ledger.errors,
            *ledger.open_items,
        ]
    )
    files = {f.path for f in ledger.files} | {m.group(1) for m in _FILE.finditer(text)}
    words = {w.lower(): w for w in _identifiers(text)}
    return set(ledger.handles), files, words


def check(
    prepared: Prepared, request: SummaryRequest, max_tokens: int, count: Callable[[str], int]
) -> str | None:
    """Why ``prepared`` may not stand for ``request``'s summary, or None when it may."""
    start, _ = request.covered
    covered = request.covered_digests
    if prepared.start != start or prepared.digests != covered[: len(prepared.digests)]:
        return "stale"
    if len(prepared.digests) > len(covered):
        return "stale"
    text = prepared.result.text
    handles, files, words = known_names(request.ledger)
    unknown_handle = next((h for h in _HANDLE.findall(text) if h not in handles), None)
    if unknown_handle is not None:
        return f"rejected: names handle {unknown_handle}, which the ledger does not know"
    unknown_file = next(
        (f for f in (m.group(1) for m in _FILE.finditer(text)) if not _known_file(f, files)), None
    )
    if unknown_file is not None:
        return f"rejected: names file {unknown_file}, which the ledger does not know"
    for word in _identifiers(text):
        spelled = words.get(word.lower())
        if spelled is not None and spelled != word:
            return f"rejected: spells {spelled} as {word}"
    if count(text) > max_tokens:
        return "rejected: over the summary budget"
    return None


def _decoded(raw: bytes) -> Prepared | None:
    try:
        data = orjson.loads(raw)
        result = SummaryResult(**data["result"])
        # One stored before payers were recorded matches no request ("unknown").
        payer = str(data.get("payer") or "unknown")
        return Prepared(int(data["start"]), tuple(data["digests"]), result, float(data["made"]), payer)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _known_file(name: str, files: set[str]) -> bool:
    return name in files or any(f.endswith("/" + name) or name.endswith("/" + f) for f in files)


class PreparedSummaries:
    """The prepared summaries of this process's sessions, and the preparations running."""

    def __init__(
        self,
        *,
        max_tokens: int,
        count: Callable[[str], int],
        concurrency: int = 2,
        timeout: float = 60.0,
        max_sessions: int = 10_000,
        counted: Callable[[str], None] = lambda result: None,
        shared: PreparedStore | None = None,
        spent: Callable[[int, int], None] = lambda input_tokens, output_tokens: None,
    ) -> None:
        self.max_tokens = max_tokens
        self.count = count
        self.timeout = timeout
        self.max_sessions = max_sessions
        self.counted = counted
        # The summarizer's tokens spent on preparations (used or not): their cost.
        self.spent = spent
        # Other processes on the same store (replicas on Redis, workers): what one prepares,
        # whichever serves the session's next point takes.
        self.shared = shared
        self._slots = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self._ready: OrderedDict[str, Prepared] = OrderedDict()
        self._tried: OrderedDict[str, int] = OrderedDict()
        self._dry_runs: dict[str, asyncio.Task[None]] = {}
        self._running: dict[str, tuple[asyncio.Task[None], int]] = {}
        self._per_tenant: dict[str, int] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def running(self, session: str) -> bool:
        return session in self._running

    def has(self, session: str) -> bool:
        return session in self._ready

    def start(self, tenant: str, session: str, request: SummaryRequest, summarizer: Summarizer) -> bool:
        """Summarize ``request`` in the background for ``session``; False when at the bound."""
        if self._per_tenant.get(tenant, 0) >= self._concurrency:
            self.counted("skipped")
            return False
        previous = self._running.pop(session, None)
        if previous is not None:
            previous[0].cancel()  # a newer range of this session: the older one is stale
        task = asyncio.ensure_future(self._prepare(tenant, session, request, summarizer))
        self._running[session] = (task, id(task))
        self._per_tenant[tenant] = self._per_tenant.get(tenant, 0) + 1
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._done(tenant, session, t))
        return True

    def _done(self, tenant: str, session: str, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._per_tenant[tenant] = max(0, self._per_tenant.get(tenant, 1) - 1)
        running = self._running.get(session)
        if running is not None and running[1] == id(task):
            del self._running[session]

    async def _prepare(
        self, tenant: str, session: str, request: SummaryRequest, summarizer: Summarizer
    ) -> None:
        async with self._slots:
            try:
                result = await asyncio.wait_for(summarizer.summarize(request), self.timeout)
            except Exception:  # the ledger stands in, as for a summarizer failing at a point
                self.counted("failed")
                return
        self.spent(result.input_tokens, result.output_tokens)
        if result.fallback_reason is not None or not result.text.strip():
            self.counted("failed")
            return
        payer = str(getattr(summarizer, "payer", KEYLESS))
        prepared = Prepared(request.covered[0], request.covered_digests, result, time.time(), payer)
        self._ready[session] = prepared
        self._ready.move_to_end(session)
        if self.shared is not None:
            try:
                await self.shared.put(tenant, session, orjson.dumps(prepared))
            except Exception:  # this process still has it
                self.counted("unshared")
        while len(self._ready) > self.max_sessions:
            self._ready.popitem(last=False)
        self.counted("prepared")

    async def take(
        self, tenant: str, session: str, request: SummaryRequest, payer: str = KEYLESS
    ) -> tuple[SummaryResult | None, str]:
        """The prepared summary standing for ``request``'s (this process's, else one another
        process prepared), or None and why. Taken: never used twice. ``payer``: the credential
        that would pay for this request's summary; one another credential paid for is not
        served."""
        self._tried.pop(session, None)  # a new cycle: the next mark prepares afresh
        prepared = self._ready.pop(session, None)
        if self.shared is not None:
            try:
                stored = await self.shared.take(tenant, session)
            except Exception:  # the store is away: this process's own, if any
                stored = None
            if prepared is None and stored is not None:
                prepared = _decoded(stored)
        if prepared is None:
            return None, "none_ready"
        if prepared.payer != payer or payer == "refused":
            return None, "rejected: prepared with another credential"
        why = check(prepared, request, self.max_tokens, self.count)
        if why is not None:
            return None, why
        return replace(prepared.result, prepared="used"), "used"

    def after_request(
        self,
        tenant: str,
        session: str,
        outcome: PolicyOutcome,
        model: Summarizer,
        dry_run: Callable[[Checkpoint], Awaitable[SummaryRequest | None]],
        prepare_at: float,
    ) -> asyncio.Task[None] | None:
        """Past the prepare mark, between compaction points: the next point's summary request
        (a dry run of the policy, in the background) goes to the summarizer."""
        trigger = outcome.facts.trigger
        if trigger is None or outcome.trigger is not None:
            return None
        if trigger.request_tokens < prepare_at * trigger.window:
            return None
        if self.has(session) or self.running(session):
            return None
        # A dry run that found nothing to summarize is tried again only once the request has
        # grown by another 5% of the window (not on every step).
        tried = self._tried.get(session)
        if tried is not None and trigger.request_tokens < tried + 0.05 * trigger.window:
            return None
        self._tried[session] = trigger.request_tokens
        self._tried.move_to_end(session)
        while len(self._tried) > self.max_sessions:
            self._tried.popitem(last=False)
        checkpoint = outcome.checkpoint

        async def prepare() -> None:
            request = await dry_run(checkpoint)
            if request is not None and request.covered_digests and not self.running(session):
                self.start(tenant, session, request, model)

        task = asyncio.ensure_future(prepare())
        self._dry_runs[session] = task
        task.add_done_callback(
            lambda t: self._dry_runs.pop(session, None) if self._dry_runs.get(session) is t else None
        )
        return task

    async def settle(self, session: str) -> None:
        """Wait for this session's preparation in flight (its dry run, then its summarizer
        call): what a replay asks for, so that its decisions are those of a live proxy whose
        agent steps take longer than the summarizer."""
        for task in (self._dry_runs.get(session), (self._running.get(session) or (None, 0))[0]):
            if task is not None:
                await asyncio.wait({task}, timeout=self.timeout)

    async def drain(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


class NeverWaiting:
    """The summarizer a compaction point gets: the prepared summary when it passes the checks,
    else the ledger alone at once, and this range prepared for the next point."""

    def __init__(
        self, summaries: PreparedSummaries, tenant: str, session: str, model: Summarizer, wait: bool = False
    ) -> None:
        """``wait``: settle the session's preparation in flight first (the replay's header)."""
        self.wait = wait
        self.summaries = summaries
        self.tenant = tenant
        self.session = session
        self.model = model

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        if self.wait:
            await self.summaries.settle(self.session)
        payer = str(getattr(self.model, "payer", KEYLESS))
        used, why = await self.summaries.take(self.tenant, self.session, request, payer)
        self.summaries.counted(
            "stale" if why == "stale" else "rejected" if why.startswith("rejected") else why
        )
        if used is not None:
            return used
        if not self.summaries.running(self.session):
            self.summaries.start(self.tenant, self.session, request, self.model)
        return SummaryResult(text="", model="ledger", prompt_family="ledger", prepared=why)


class Capture:
    """A summarizer that only keeps the request a dry run of the policy would make."""

    def __init__(self) -> None:
        self.request: SummaryRequest | None = None

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.request = request
        return SummaryResult(text="", model="ledger", prompt_family="ledger")


def make_prepared(
    settings: Settings, counter: TokenCounter, metrics: Metrics, store: object | None
) -> PreparedSummaries | None:
    """Summaries prepared ahead, with a model summarizer and ``summarizer.prepare_at`` set;
    ``store``: shared with the other processes on it (replicas on Redis, workers)."""
    summarizer = settings.summarizer
    if summarizer.kind != "openai" or summarizer.prepare_at is None:
        return None

    def spent(input_tokens: int, output_tokens: int) -> None:
        metrics.prepared_summary_tokens.labels("input").inc(input_tokens)
        metrics.prepared_summary_tokens.labels("output").inc(output_tokens)

    return PreparedSummaries(
        max_tokens=summarizer.max_output_tokens,
        count=lambda text: counter.count_text(text, settings.tokens.default_encoding),
        concurrency=summarizer.prepare_concurrency,
        timeout=summarizer.timeout,
        max_sessions=settings.sessions.max_sessions,
        counted=lambda result: metrics.prepared_summaries.labels(result).inc(),
        shared=make_prepared_store(store) if store is not None else None,
        spent=spent,
    )
