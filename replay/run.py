"""Shadow replay: recorded cases through the running proxy, step by step, arm by arm.

For each arm (a policy of the proxy's configuration) and each case, the history before each
recorded assistant message is one request, sent over HTTP as the agent sent it, in its own
session; the recorded upstream answers with that recorded message. Then each question is
appended to the final history (Figure 7: every question sees the same history view) and the
view the arm sends is captured, for the evidence check and, with an answering model, for an
answer. Each finished (arm, case) is saved under ``DIR/parts`` so an interrupted run resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson

from policies.conversation import Message
from proxy.app import make_store
from proxy.sessions import tenant_of
from proxy.settings import Settings, load_settings
from proxy.store import Store
from replay.answers import AnswerRun, answer_question
from replay.cases import Case, Rejected, build_case
from replay.config import ReplayConfig, config_builtins
from replay.doors import PATHS, request
from replay.proxy_process import ProxyProcess, replay_proxy_config
from replay.questions import Question, build_questions
from replay.rows import iter_rows
from replay.survival import handles_in, survival, view_text
from replay.upstream import TICKET_HEADER, Received, RecordedUpstream, Ticket

REPLAY_KEY = "sk-replay-harness"
PART_VERSION = 2


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
    # forward to http://127.0.0.1:<upstream_port>/v1.
    upstream_port: int = 0


@dataclass(slots=True)
class Loaded:
    cases: list[Case]
    rejected: list[Rejected]
    questions: dict[str, list[Question]]
    omitted: dict[str, dict[str, int]]  # kind -> reason -> count
    input_sha256: str


def load_cases(path: Path, limit: int | None, kinds: Sequence[str]) -> Loaded:
    cases: list[Case] = []
    rejected: list[Rejected] = []
    questions: dict[str, list[Question]] = {}
    omitted: dict[str, dict[str, int]] = {}
    digest = hashlib.sha256()
    for row_number, row in enumerate(iter_rows(path)):
        if limit is not None and len(cases) >= limit:
            break
        digest.update(orjson.dumps(row))
        built = build_case(row, row_number)
        if isinstance(built, Rejected):
            rejected.append(built)
            continue
        cases.append(built)
        found, reasons = build_questions(built, kinds)
        questions[built.case_id] = found
        for kind, reason in reasons.items():
            by_reason = omitted.setdefault(kind, {})
            by_reason[reason] = by_reason.get(reason, 0) + 1
    return Loaded(cases, rejected, questions, omitted, digest.hexdigest())


@dataclass(slots=True)
class CasePart:
    """What one arm did on one case: the deterministic figures and any answers."""

    arm: str
    case_id: str
    key: str
    tokens_before: list[int] = field(default_factory=list)
    tokens_after: list[int] = field(default_factory=list)
    triggers: list[str | None] = field(default_factory=list)
    stable: list[bool | None] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    compaction_events: int = 0
    summaries: int = 0
    summarizer_model_calls: int = 0
    summarizer_input_tokens: int = 0
    summarizer_output_tokens: int = 0
    summary_kinds: list[str] = field(default_factory=list)
    # Each compaction point's decisions: trigger, covered range, handles, summary hash.
    decisions: list[dict[str, Any]] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"version": PART_VERSION, **{k: getattr(self, k) for k in self.__slots__}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CasePart:
        return cls(**{k: v for k, v in data.items() if k in cls.__slots__})


def _part_key(arm: str, case: Case, config: ReplayConfig, policy: Any, input_sha: str) -> str:
    relevant = {
        "arm": arm,
        "case": case.case_id,
        "input": input_sha,
        "policy": policy,
        "config": {
            k: v
            for k, v in config_builtins(config).items()
            if k not in ("gate", "concurrency", "judge_model", "arms")
        },
    }
    return hashlib.sha256(orjson.dumps(relevant, option=orjson.OPT_SORT_KEYS)).hexdigest()[:24]


def _is_prefix(previous: Sequence[bytes], current: Sequence[bytes]) -> bool:
    return len(previous) <= len(current) and tuple(current[: len(previous)]) == tuple(previous)


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
        self.run_id = hashlib.blake2b(str(options.out.resolve()).encode(), digest_size=4).hexdigest()

    async def close(self) -> None:
        await self.http.aclose()

    def headers(self, arm: str, session: str, ticket: str, mode: str) -> dict[str, str]:
        headers = {
            "authorization": f"Bearer {REPLAY_KEY}",
            "x-session-id": session,
            "x-compaction-policy": arm,
            "x-compaction-mode": mode,
            TICKET_HEADER: ticket,
        }
        return headers

    def body(self, case: Case, messages: Sequence[Message]) -> bytes:
        """The request a client of the replay's door sends for this history."""
        return orjson.dumps(request(self.config.dialect, self.config.model, messages, case.tools))

    async def send(
        self, arm: str, session: str, case: Case, messages: Sequence[Message], ticket: Ticket, mode: str
    ) -> tuple[httpx.Response, Ticket]:
        name = self.upstream.issue(ticket)
        try:
            response = await self.http.post(
                self.proxy_url + PATHS[self.config.dialect],
                content=self.body(case, messages),
                headers={**self.headers(arm, session, name, mode), "content-type": "application/json"},
            )
        finally:
            ticket = self.upstream.close_ticket(name)
        return response, ticket

    async def replay_case(self, arm: str, case: Case, key: str) -> CasePart:
        started = time.perf_counter()
        part = CasePart(arm=arm, case_id=case.case_id, key=key)
        session = f"replay-{self.run_id}-{arm}-{case.case_id}"
        previous: tuple[bytes, ...] | None = None
        for index in case.steps:
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
                    None if previous is None or trigger else _is_prefix(previous, received.digests)
                )
                previous = received.digests
            else:
                part.stable.append(None)
            self.on_progress()
        await self.record_events(part, session)
        await self.ask_questions(arm, case, session, part)
        part.seconds = round(time.perf_counter() - started, 3)
        return part

    async def record_events(self, part: CasePart, session: str) -> None:
        """Compaction events and summarizer calls of the session, from the proxy's events."""
        expected = sum(1 for t in part.triggers if t)
        events: list[dict[str, Any]] = []
        params: dict[str, str | int] = {"session": session, "limit": 1000}
        headers = {"authorization": f"Bearer {REPLAY_KEY}"}
        if self.options.admin_token:
            headers = {"authorization": f"Bearer {self.options.admin_token}"}
            params["tenant"] = self.tenant
        # Events are written in the background: wait briefly for the last ones.
        for _ in range(40):
            response = await self.http.get(
                self.proxy_url + "/v1/compaction/events", params=params, headers=headers
            )
            if response.status_code != 200:
                part.errors.append(f"events: HTTP {response.status_code}")
                return
            events = response.json().get("data") or []
            if sum(1 for e in events if e.get("trigger")) >= expected:
                break
            await asyncio.sleep(0.05)
        for event in events:
            if event.get("trigger"):
                part.compaction_events += 1
                summary_hash = (event.get("summary") or {}).get("hash")
                part.decisions.append(
                    {
                        "trigger": event["trigger"],
                        "covered": (event.get("parent_range") or {}).get("messages"),
                        "handles": sorted(event.get("handles_offloaded") or []),
                        "summary_hash": summary_hash,
                        "tokens_after": event.get("tokens_after"),
                    }
                )
            summary = event.get("summary")
            if isinstance(summary, dict) and event.get("trigger"):
                part.summaries += 1
                model = summary.get("model") or "?"
                part.summary_kinds.append(str(model))
                if model != "ledger":
                    part.summarizer_model_calls += 1
                    part.summarizer_input_tokens += int(summary.get("input_tokens") or 0)
                    part.summarizer_output_tokens += int(summary.get("output_tokens") or 0)

    async def read_output(self, handle: str) -> str | None:
        stored = await self.store.get_output(self.tenant, handle)
        return stored.content if stored is not None else None

    async def ask_questions(self, arm: str, case: Case, session: str, part: CasePart) -> None:
        questions = self.loaded.questions.get(case.case_id, [])
        final = list(case.messages)
        for question in questions:
            messages = [*final, {"role": "user", "content": question.prompt}]
            ticket = Ticket(
                reply={"role": "assistant", "content": "(recorded upstream: no answering model)"},
                keep_messages=True,
            )
            # Questions always see the arm's view, also when the steps ran in shadow mode.
            response, ticket = await self.send(arm, session, case, messages, ticket, "enforce")
            entry: dict[str, Any] = {
                "question_id": question.question_id,
                "kind": question.kind,
                "tokens_in_view": int(response.headers.get("x-compaction-tokens-after", 0) or 0),
            }
            received: Received | None = ticket.received[0] if ticket.received else None
            if response.status_code != 200 or received is None or received.messages is None:
                entry.update(survival="lost", missing=list(question.evidence), error=response.status_code)
                part.errors.append(f"question {question.kind}: HTTP {response.status_code}")
            else:
                part.problems.extend(f"question {question.kind}: {p}" for p in received.problems)
                saved: dict[str, str | None] = {}
                for handle in _handles(received.messages):
                    saved[handle] = await self.read_output(handle)
                state, missing = survival(question.evidence, received.messages, saved.get)
                entry.update(
                    survival=state,
                    missing=missing,
                    read_tool_offered="read_tool_output" in received.tool_names,
                )
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


async def run_replay(options: RunOptions) -> dict[str, Any]:
    """Replay every case through every arm; returns the raw parts (see ``replay.results``)."""
    from replay.progress import Progress

    config = options.config
    settings = proxy_settings(options)
    unknown = [arm for arm in config.arms if arm not in settings.policies]
    if unknown:
        raise ValueError(
            f"arms not defined in the proxy configuration: {', '.join(unknown)} "
            f"(defined: {', '.join(settings.policies)})"
        )
    loaded = load_cases(options.input, options.limit, config.kinds)
    options.out.mkdir(parents=True, exist_ok=True)
    parts_dir = options.out / "parts"
    if options.proxy_url is not None and not options.upstream_port:
        raise ValueError(
            "--proxy-url needs --upstream-port: the given proxy must forward to the recorded "
            "upstream at http://127.0.0.1:<upstream-port>/v1"
        )
    upstream = RecordedUpstream()
    await upstream.start(options.upstream_port)
    proxy: ProxyProcess | None = None
    proxy_url = options.proxy_url
    env: dict[str, str] = {}
    if config.summarizer_model is not None:
        env["COMPACTION_PROXY_SUMMARIZER_API_KEY"] = config.summarizer_model.api_key()
    if proxy_url is None:
        state_dir = options.out / "proxy-state"
        derived = replay_proxy_config(settings, config, upstream.base_url, state_dir)
        proxy = ProxyProcess(derived, options.out, env)
        await asyncio.to_thread(proxy.start)
        proxy_url = proxy.url
        store_settings = msgspec.convert(derived, Settings)
    else:
        store_settings = settings
    store = make_store(store_settings)
    total_steps = sum(len(c.steps) for c in loaded.cases) * len(config.arms)
    progress = Progress(total_steps, enabled=options.progress)
    replayer = Replayer(options, loaded, proxy_url, upstream, store, progress.advance)
    semaphore = asyncio.Semaphore(config.concurrency)
    parts: dict[tuple[str, str], CasePart] = {}
    specs = {name: msgspec.to_builtins(p) for name, p in settings.policies.items()}

    async def one(arm: str, case: Case) -> None:
        key = _part_key(arm, case, config, specs[arm], loaded.input_sha256)
        path = parts_dir / arm / f"{case.case_id}.json"
        if path.exists():
            with contextlib.suppress(ValueError, TypeError, KeyError):
                saved = orjson.loads(path.read_bytes())
                if saved.get("key") == key and saved.get("version") == PART_VERSION:
                    parts[(arm, case.case_id)] = CasePart.from_json(saved)
                    progress.advance(len(case.steps))
                    return
        async with semaphore:
            part = await replayer.replay_case(arm, case, key)
        parts[(arm, case.case_id)] = part
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(orjson.dumps(part.to_json()))
        temporary.replace(path)

    started = time.perf_counter()
    try:
        # Arm-major order keeps one arm's cases together in the proxy's caches.
        await asyncio.gather(*(one(arm, case) for arm in config.arms for case in loaded.cases))
    finally:
        progress.close()
        await replayer.close()
        await store.close()
        await upstream.stop()
        if proxy is not None:
            await asyncio.to_thread(proxy.stop)
    return {
        "loaded": loaded,
        "parts": parts,
        "seconds": time.perf_counter() - started,
        "policy_specs": specs,
        "proxy_url": options.proxy_url or "own",
        "unexpected_upstream_requests": upstream.unexpected,
    }
