"""Replicas as deployed: proxy processes on one real Redis behind a real load balancer
(Debian's HAProxy, round robin, no stickiness), and the agents that drive them.

``Cluster`` starts Redis (an append-only file synced on every write, so a restart on the same
directory keeps what was stored), ``replicas`` proxy processes on it and HAProxy in front, all
on free loopback ports, and stops each by its PID. HAProxy adds ``x-replica`` (the server that
answered) to every answer. ``run_agents`` drives many agent sessions at once through the
balancer with the OpenAI SDK's ``AsyncOpenAI`` (its own retries on a reset connection or a 502),
answering each call of the agent's tool with the step's output. The end-to-end test
(``tests/e2e/test_replicas_balancer.py``) and ``benchmarks/replicas.py`` use it."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai

from replay.session.proxy_process import ProxyProcess
from tests import redis_server
from tests.agent_upstream import DONE_PREFIX, RUN_HEADER, STEP_MARK, step_output
from tests.fake_upstream import free_port
from tests.needs import service_binary
from tests.proxy.data_plane.chat_wire import BASH

KEY = "sk-replicas-balancer-000000"
ADMIN = "admin-token-replicas-000000"
STEP = re.compile(rf"{STEP_MARK}-(\d+) line")


def haproxy_config(port: int, backends: list[int]) -> str:
    """Round robin per request, no stickiness; a replica that stops answering ``/readyz`` is
    taken out within about a second; failed connects are retried on another replica."""
    servers = "\n".join(
        f"  server r{n} 127.0.0.1:{backend} check inter 300ms fall 2 rise 2"
        for n, backend in enumerate(backends)
    )
    return f"""global
  maxconn 4096
defaults
  mode http
  timeout connect 1s
  timeout client 120s
  timeout server 120s
  retries 3
  option redispatch
frontend agents
  bind 127.0.0.1:{port}
  default_backend replicas
backend replicas
  balance roundrobin
  option httpchk GET /readyz
  http-response set-header x-replica %[srv_name]
{servers}
"""


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Cluster:
    """Redis, ``replicas`` proxy processes on it, HAProxy in front; ``stop`` stops each by PID."""

    def __init__(self, directory: Path, upstream_url: str, replicas: int, config: dict[str, Any]) -> None:
        self.directory = directory
        self.upstream_url = upstream_url
        self.count = replicas
        self.config = config
        self.redis: subprocess.Popen[bytes] | None = None
        self.redis_port = 0
        self.replicas: list[ProxyProcess] = []
        self.balancer: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> Cluster:
        haproxy = service_binary("haproxy")
        (self.directory / "redis").mkdir(parents=True, exist_ok=True)
        files = self.directory / "redis"
        self.redis, self.redis_port = redis_server.start_on_a_free_port(files, persistent=True)
        for n in range(self.count):
            config = {
                **self.config,
                "upstream": {"base_url": self.upstream_url},
                "store": {"backend": "redis", "redis_url": self.redis_url},
                "state_dir": str(self.directory / f"replica{n}" / "state"),
                "logging": {"level": "info", "format": "json"},
            }
            replica = ProxyProcess(config, self.directory / f"replica{n}")
            self.replicas.append(replica)
            replica.start()
        self.port = free_port()
        path = self.directory / "haproxy.cfg"
        path.write_text(haproxy_config(self.port, [r.port for r in self.replicas]))
        log = (self.directory / "haproxy.log").open("ab")
        self.balancer = subprocess.Popen([haproxy, "-db", "-f", str(path)], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while not self.all_up():
            if self.balancer.poll() is not None or time.monotonic() > deadline:
                said = (self.directory / "haproxy.log").read_text()[-2000:]
                raise RuntimeError(f"haproxy did not start: {said}")
            time.sleep(0.1)
        return self

    def all_up(self) -> bool:
        """The balancer answers and has sent a request to every replica (health checks pass)."""
        if not _listening(self.port):
            return False
        seen = set()
        for _ in range(3 * self.count):
            try:
                answer = httpx.get(self.base_url.removesuffix("/v1") + "/readyz", timeout=2, trust_env=False)
            except httpx.HTTPError:
                return False
            seen.add(answer.headers.get("x-replica"))
        return len(seen) == self.count

    def kill_replica(self, n: int) -> None:
        """SIGKILL, as a crashed machine: no goodbye to the balancer or the clients."""
        process = self.replicas[n].process
        assert process is not None
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)

    def restart_redis(self) -> float:
        """Stop Redis by its PID and start it again on the same port and files; the seconds it
        was away."""
        assert self.redis is not None
        started = time.monotonic()
        redis_server.stop(self.redis)
        self.redis = redis_server.start(self.redis_port, self.directory / "redis", persistent=True)
        return time.monotonic() - started

    def pids(self) -> list[int]:
        return [r.process.pid for r in self.replicas if r.process is not None and r.process.poll() is None]

    def live(self) -> list[ProxyProcess]:
        return [r for r in self.replicas if r.process is not None and r.process.poll() is None]

    def stop(self) -> None:
        if self.balancer is not None and self.balancer.poll() is None:
            self.balancer.terminate()
            try:
                self.balancer.wait(10)
            except subprocess.TimeoutExpired:
                self.balancer.kill()
                self.balancer.wait(5)
        for replica in self.replicas:
            replica.stop()
        if self.redis is not None and self.redis.poll() is None:
            redis_server.stop(self.redis)


@dataclass
class SessionRun:
    """What one agent session saw through the balancer."""

    name: str
    steps_done: int = 0  # tool calls answered
    finished: bool = False  # got the model's final answer
    arms: set[str] = field(default_factory=set)  # x-compaction-arm of its answers
    replicas: set[str] = field(default_factory=set)  # x-replica of its answers
    requests: int = 0


@dataclass
class Progress:
    """Steps answered over all sessions, for a driver that acts after a share of them."""

    steps: int = 0
    attempts: int = 0  # HTTP requests sent, the SDK's retries included
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self) -> None:
        self.steps += 1
        self.changed.set()

    async def count_attempt(self, _request: Any) -> None:
        self.attempts += 1

    async def reach(self, steps: int) -> None:
        while self.steps < steps:
            self.changed.clear()
            await self.changed.wait()


async def run_session(
    client: openai.AsyncOpenAI, name: str, steps: int, lines: int, progress: Progress
) -> SessionRun:
    """One agent's loop: each call of its tool answered with that step's output, to the final
    answer. Step numbers come from the command the model sent (a retried request whose first
    answer was lost moves the scripted model on a step)."""
    run = SessionRun(name)
    messages: list[Any] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Session {name}: run the {steps} checks and report."},
    ]
    headers = {RUN_HEADER: name, "x-session-id": name}
    for _ in range(steps + 4):
        raw = await client.chat.completions.with_raw_response.create(
            model="agent-model",
            messages=messages,
            tools=[BASH],  # type: ignore[list-item]
            max_tokens=256,
            extra_headers=headers,
        )
        run.requests += 1
        run.arms.add(raw.headers.get("x-compaction-arm", "none"))
        run.replicas.add(raw.headers.get("x-replica", "?"))
        message = raw.parse().choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            run.finished = (message.content or "").startswith(DONE_PREFIX)
            return run
        for call in message.tool_calls:
            found = STEP.search(call.function.arguments)  # type: ignore[union-attr]
            step = int(found.group(1)) if found else run.steps_done + 1
            messages.append({"role": "tool", "tool_call_id": call.id, "content": step_output(step, lines)})
            run.steps_done += 1
            progress.add()
    return run


async def run_agents(
    base_url: str,
    sessions: int,
    steps: int,
    lines: int,
    during: Callable[[Progress], Any] | None = None,
    progress: Progress | None = None,
    prefix: str = "agent",
) -> list[SessionRun]:
    """``sessions`` agents at once through ``base_url``, the SDK retrying (backoff from 0.5 s)
    on a reset connection or a 5xx; ``during(progress)``, a coroutine, runs alongside."""
    progress = progress or Progress()
    # The SDK's own HTTP client (its httpx2), with room for every session at once.
    limits = httpx2.Limits(max_connections=sessions + 8, max_keepalive_connections=sessions + 8)
    hooks = {"request": [progress.count_attempt]}
    async with openai.DefaultAsyncHttpxClient(limits=limits, trust_env=False, event_hooks=hooks) as http:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=6, http_client=http)
        runs = [run_session(client, f"{prefix}-{n:03d}", steps, lines, progress) for n in range(sessions)]
        if during is None:
            return list(await asyncio.gather(*runs))
        *results, _ = await asyncio.gather(*runs, during(progress))
        return list(results)
