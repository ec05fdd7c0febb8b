"""One replayer: a recorded upstream, a proxy, and the (arm, case) pairs sent through them.

For each (arm, case), the history before each recorded assistant message is one request, sent
over HTTP as the agent sent it, in its own session; the recorded upstream answers with that
recorded message. Then each question is appended to the final history (Figure 7: every
question sees the same history view) and the view the arm sends is captured, for the evidence
check and, with an answering model, for an answer. ``replay_items`` runs one replayer: in the
run's own process (``--jobs 1``) or in each worker process (``replay.run.jobs``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson

from policies.conversation import Message
from proxy.config.settings import Settings, load_settings
from proxy.state.sessions import tenant_of
from proxy.state.store import Store
from proxy.state.store_factory import make_store
from replay.config import ReplayConfig
from replay.questions import Question
from replay.questions.drift import lost_snippet, question_cycles
from replay.questions.state_contract import stale_presented
from replay.recording.cases import Case
from replay.run.loading import Loaded
from replay.run.parts import CasePart, WorkItem, part_path, write_part
from replay.run.session_events import add_cost, add_decisions, read_session_events
from replay.run.shards import Shard
from replay.session.answers import AnswerRun, answer_question
from replay.session.clock import CLOCK_HEADER, step_times
from replay.session.doors import key_header, request, request_path
from replay.session.proxy_process import ProxyProcess, replay_proxy_config
from replay.session.reader import Reader
from replay.session.survival import handles_in, survival, view_text
from replay.session.upstream import TICKET_HEADER, Received, RecordedUpstream, Ticket

REPLAY_KEY = "sk-replay-harness"


@dataclass(frozen=True, slots=True)
class RunOptions:
    input: Path
    out: Path
    config: ReplayConfig
    proxy_config: Path | None = None
    proxy_url: str | None = None
    limit: int | None = None
    progress: bool = True
    admin_token: str | None = None
    # Port of the recorded upstream (0: any free one). A proxy given with ``proxy_url`` must
    # forward to http://127.0.0.1:<upstream_port>/v1 (Gemini doors: ``gemini.base_url`` and
    # ``gemini.code_assist_url`` http://127.0.0.1:<upstream_port>).
    upstream_port: int = 0
    # Worker processes, each with its own recorded upstream and proxy (``replay.run.jobs``).
    jobs: int = 1
    # Replay only this slice of the cases (``replay.run.shards``); None: all of them.
    shard: Shard | None = None


def _is_prefix(previous: Sequence[bytes], current: Sequence[bytes], tail: int | None = None) -> bool:
    """Whether ``current`` keeps ``previous`` up to ``tail`` (default: whole): between points
    a tight session may change the previous view's tail, and a prompt cache keeps the rest."""
    kept = len(previous) if tail is None else tail
    return len(previous) <= len(current) and tuple(current[:kept]) == tuple(previous[:kept])


class Replayer:
    def __init__(
        self,
        options: RunOptions,
        loaded: Loaded,
        proxy_url: str,
        upstream: RecordedUpstream,
        store: Store,
        on_progress: Callable[[], None] = lambda: None,
    ) -> None:
        self.options = options
        self.config = options.config
        self.loaded = loaded
        self.proxy_url = proxy_url.rstrip("/")
        self.upstream = upstream
        self.store = store
        self.tenant = tenant_of([(b"authorization", f"Bearer {REPLAY_KEY}".encode())])
        self.on_progress = on_progress
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(900.0, connect=10.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
            trust_env=False,
        )
        # Each session's simulated time now (``replay.session.clock``).
        self.clock: dict[str, float] = {}
        self.run_id = hashlib.blake2b(str(options.out.resolve()).encode(), digest_size=4).hexdigest()

    async def close(self) -> None:
        await self.http.aclose()

    def headers(self, arm: str, session: str, ticket: str, mode: str) -> dict[str, str]:
        headers = {
            **key_header(self.config.dialect, REPLAY_KEY),
            "x-session-id": session,
            "x-compaction-policy": arm,
            "x-compaction-mode": mode,
            # With summaries prepared ahead, a compaction point takes what its preparation
            # makes: the decisions of a live agent whose steps outlast the summarizer, every run.
            "x-compaction-prepared": "wait",
            TICKET_HEADER: ticket,
        }
        return headers

    def body(self, case: Case, messages: Sequence[Message]) -> bytes:
        """The request a client of the replay's door sends for this history."""
        return orjson.dumps(request(self.config.dialect, self.config.model, messages, case.tools))

    async def send(
        self, arm: str, session: str, case: Case, messages: Sequence[Message], ticket: Ticket, mode: str
    ) -> tuple[httpx.Response, Ticket]:
        # Every request of a session after its last step (questions, answers) comes at its time.
        ticket.at = self.clock.get(session, 0.0)
        name = self.upstream.issue(ticket)
        headers = {**self.headers(arm, session, name, mode), "content-type": "application/json"}
        if self.config.cache.timed:
            headers[CLOCK_HEADER] = f"{ticket.at:.3f}"
        try:
            response = await self.http.post(
                self.proxy_url + request_path(self.config.dialect, self.config.model),
                content=self.body(case, messages),
                headers=headers,
            )
        finally:
            ticket = self.upstream.close_ticket(name)
        return response, ticket

    async def replay_case(self, arm: str, case: Case, key: str) -> CasePart:
        started = time.perf_counter()
        part = CasePart(arm=arm, case_id=case.case_id, key=key)
        session = f"replay-{self.run_id}-{arm}-{case.case_id}"
        previous: tuple[bytes, ...] | None = None
        tail = 0
        times = step_times(case.case_id, case.steps, self.config.cache.idle)
        for index, at in zip(case.steps, times, strict=True):
            self.clock[session] = at
            history = case.messages[:index]
            response, ticket = await self.send(
                arm, session, case, history, Ticket(reply=case.messages[index]), self.config.mode
            )
            if response.status_code != 200:
                part.errors.append(f"step {index}: HTTP {response.status_code}: {response.text[:200]}")
                continue
            before = int(response.headers.get("x-compaction-tokens-before", 0))
            after = int(response.headers.get("x-compaction-tokens-after", before))
            trigger = response.headers.get("x-compaction-trigger")
            part.tokens_before.append(before)
            part.tokens_after.append(after)
            part.triggers.append(trigger)
            received = ticket.received[0] if ticket.received else None
            if received is None:
                part.stable.append(None)
                continue
            part.problems.extend(f"step {index}: {p}" for p in received.problems)
            if self.config.mode == "enforce":
                part.stable.append(
                    None if previous is None or trigger else _is_prefix(previous, received.digests, tail)
                )
                previous, tail = received.digests, received.tail_start
            else:
                part.stable.append(None)
            self.on_progress()
        await self.record_events(part, session)
        await self.ask_questions(arm, case, session, part)
        await self.record_cost(part, session)
        part.requests = self.upstream.take_session(session)
        self.clock.pop(session, None)
        part.seconds = round(time.perf_counter() - started, 3)
        return part

    async def session_events(self, part: CasePart, session: str, expected: int = 0) -> list[dict[str, Any]]:
        """The session's events once its preparations are done (``session_events.py``)."""
        token = self.options.admin_token or REPLAY_KEY
        tenant = self.tenant if self.options.admin_token else None
        found = await read_session_events(self.http, self.proxy_url, session, token, tenant, expected)
        if isinstance(found, str):
            part.errors.append(found)
            return []
        return found

    async def record_events(self, part: CasePart, session: str) -> None:
        """Compaction points and the summaries they used, from the proxy's events of the
        session's steps (their summarizer tokens: ``record_cost``)."""
        add_decisions(part, await self.session_events(part, session, sum(1 for t in part.triggers if t)))

    async def record_cost(self, part: CasePart, session: str) -> None:
        """The summarizer's tokens of the session, read once the case is done, its questions
        too (a question past the prepare mark prepares like a step): every call the proxy made
        to the summarizer for the session (``session_events.add_cost``)."""
        add_cost(part, await self.session_events(part, session))

    async def read_output(self, handle: str) -> str | None:
        stored = await self.store.get_output(self.tenant, handle)
        return stored.content if stored is not None else None

    async def reachable_outputs(self, handles: Sequence[str], depth: int = 3) -> dict[str, str | None]:
        """The saved texts of ``handles`` and of the handles they name, ``depth`` hops deep (a
        transcript names the one before it, a cut ledger the complete one): what the store holds
        for the view, whether or not a read gets it back."""
        saved: dict[str, str | None] = {}
        frontier = list(handles)
        for _ in range(depth):
            found: list[str] = []
            for handle in frontier:
                if handle in saved:
                    continue
                saved[handle] = text = await self.read_output(handle)
                found += handles_in(text or "")
            frontier = [h for h in dict.fromkeys(found) if h not in saved]
        return saved

    async def ask_questions(self, arm: str, case: Case, session: str, part: CasePart) -> None:
        questions = self.loaded.questions.get(case.case_id, [])
        final = list(case.messages)
        for question in questions:
            messages = [*final, {"role": "user", "content": question.prompt}]
            reader = Reader(question.evidence)
            ticket = Ticket(
                reply={"role": "assistant", "content": "(recorded upstream: no answering model)"},
                keep_messages=True,
                reader=reader,
            )
            # Questions always see the arm's view, also when the steps ran in shadow mode.
            response, ticket = await self.send(arm, session, case, messages, ticket, "enforce")
            entry: dict[str, Any] = {
                "question_id": question.question_id,
                "kind": question.kind,
                "tokens_in_view": int(response.headers.get("x-compaction-tokens-after", 0) or 0),
                # Compaction cycles that passed over the fact (multi-cycle drift).
                "cycles": question_cycles(question, part.decisions),
            }
            received: Received | None = ticket.received[0] if ticket.received else None
            if response.status_code != 200 or received is None or received.messages is None:
                entry.update(survival="lost", missing=list(question.evidence), error=response.status_code)
                part.errors.append(f"question {question.kind}: HTTP {response.status_code}")
            else:
                part.problems.extend(f"question {question.kind}: {p}" for p in received.problems)
                saved = await self.reachable_outputs(_handles(received.messages))
                stored_state, stored_missing = survival(question.evidence, received.messages, saved.get)
                # Recoverable is earned by reading: the scripted reader got it back through the proxy.
                found = reader.found()
                state = stored_state
                missing = stored_missing
                if stored_state != "visible":
                    unread = [m for m in reader.missing if m not in found]
                    state, missing = ("recoverable", []) if not unread else ("lost", unread)
                entry.update(
                    survival=state,
                    missing=missing,
                    stored=stored_state != "lost",
                    read_tool_offered="read_tool_output" in received.tool_names,
                    **reader.figures(),
                )
                if question.stale or state == "lost":
                    text = view_text(received.messages)
                    if question.stale:
                        # A corrected-away value shown as if it were still current.
                        entry["stale_presented"] = stale_presented(question, text)
                    if state == "lost":
                        entry["view_snippet"] = lost_snippet(question, case, text)
                        # What the reads returned, for the failing examples of the report.
                        entry["read_snippets"] = [r[:400] for r in reader.results[:4]]
            part.questions.append(entry)
        if self.config.answer_model is not None:
            await self.answer_all(arm, case, session, part, questions)

    async def answer_all(
        self, arm: str, case: Case, session: str, part: CasePart, questions: Sequence[Question]
    ) -> None:
        assert self.config.answer_model is not None
        runs = [(arm, r) for r in range(self.config.repeats)]
        if arm == "full" and self.config.noise_floor:
            runs += [("full_repeat", r) for r in range(self.config.repeats)]
        by_id = {q["question_id"]: q for q in part.questions}
        for label, repeat in runs:
            for question in questions:
                result: AnswerRun = await answer_question(self, arm, case, session, question, repeat)
                entry = by_id[question.question_id]
                entry.setdefault("answers", []).append({"arm_label": label, "repeat": repeat, **result})

    async def post_answer_request(
        self, arm: str, session: str, case: Case, messages: Sequence[Message]
    ) -> tuple[httpx.Response, Ticket]:
        """One answering turn: through the proxy (so read_tool_output works where the arm
        offloads) to the recorded upstream, which forwards it to the answering model."""
        ticket = Ticket(reply=None, forward=self.config.answer_model)
        return await self.send(arm, session, case, messages, ticket, "enforce")


def _handles(messages: Sequence[Message]) -> list[str]:
    return handles_in(view_text(messages))


def proxy_settings(options: RunOptions) -> Settings:
    return load_settings(options.proxy_config, env={})


@dataclass(slots=True)
class Replayed:
    parts: dict[tuple[str, str], CasePart]
    unexpected_upstream_requests: int


async def replay_items(
    options: RunOptions,
    loaded: Loaded,
    items: Sequence[WorkItem],
    workdir: Path,
    on_step: Callable[[], None] = lambda: None,
) -> Replayed:
    """Replay ``items`` through one recorded upstream and one proxy (the given ``proxy_url``,
    or a proxy started with its config, log and state in ``workdir``), ``concurrency`` cases
    at a time; each finished part is saved in the run directory as soon as it is done."""
    config = options.config
    settings = proxy_settings(options)
    upstream = RecordedUpstream()
    proxy: ProxyProcess | None = None
    replayer: Replayer | None = None
    store: Store | None = None
    parts: dict[tuple[str, str], CasePart] = {}
    try:
        await upstream.start(options.upstream_port)
        proxy_url = options.proxy_url
        store_settings = settings
        if proxy_url is None:
            env: dict[str, str] = {}
            if config.summarizer_model is not None:
                env["COMPACTION_PROXY_SUMMARIZER_API_KEY"] = config.summarizer_model.api_key()
            derived = replay_proxy_config(settings, config, upstream.base_url, workdir / "proxy-state")
            proxy = ProxyProcess(derived, workdir, env)
            await asyncio.to_thread(proxy.start)
            proxy_url = proxy.url
            store_settings = msgspec.convert(derived, Settings)
        store = make_store(store_settings)
        replayer = active = Replayer(options, loaded, proxy_url, upstream, store, on_step)
        semaphore = asyncio.Semaphore(config.concurrency)

        async def one(item: WorkItem) -> None:
            async with semaphore:
                part = await active.replay_case(item.arm, item.case, item.key)
            parts[(item.arm, item.case.case_id)] = part
            write_part(part_path(options.out, item.arm, item.case.case_id), part)

        await asyncio.gather(*(one(item) for item in items))
    finally:
        if replayer is not None:
            await replayer.close()
        if store is not None:
            await store.close()
        await upstream.stop()
        if proxy is not None:
            await asyncio.to_thread(proxy.stop)
    return Replayed(parts, upstream.unexpected)
