"""A hostile or broken upstream answering a read round: what it costs the proxy.

The client's history names saved outputs, so the model (a fake upstream) first calls
``read_tool_output``; the proxy answers the read and asks again, and the upstream answers that
read follow-up round with:

- ``sse-line``: one 100 MB SSE line without a newline (streamed client);
- ``json-1gb``: a 1 GB JSON body (non-streamed client);
- ``tiny-deltas``: 400 KB of text in 4-byte deltas (streamed client), side by side with the
  same stream relayed plainly (a short request that names no saved output: no read round).

For each, the client's wall time until its answer or error, what it got (status, error
code), the proxy's peak RSS, and ``/healthz`` latency polled meanwhile. The proxy is the real
``compaction-proxy serve`` with ``improved`` at an 8k window; traffic on 127.0.0.1 only.

    .venv/bin/python benchmarks/hostile_upstream.py [--md-out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import openai
import orjson
from aiohttp import web

from benchmarks import hostile_load
from benchmarks.hostile_load import answer, step
from replay.session.proxy_process import ProxyProcess

KEY = "sk-bench-hostile-upstream-0000"
MB = 1 << 20
DELTA_TEXT_BYTES = 400_000


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse(
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}
    )


class Upstream(hostile_load.Upstream):
    """The model: a read call first when the request names a handle, then the scenario's
    hostile answer to the read follow-up round; a plain request gets the tiny-delta stream.
    (Served on loopback from its own thread, as ``hostile_load``'s upstream is.)"""

    def __init__(self) -> None:
        super().__init__()
        self.scenario = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:  # type: ignore[override]
        body = orjson.loads(await request.read())
        messages = body["messages"]
        last = messages[-1]
        if last.get("role") == "tool" and str(last.get("tool_call_id", "")).startswith("read"):
            return await self.hostile(request)
        handles = re.findall(r"handle=(out_[0-9a-f]+)", json.dumps(messages))
        if handles:
            arguments = json.dumps({"handle": handles[0], "pattern": "line"})
            call = {
                "id": "read-1",
                "type": "function",
                "function": {"name": "read_tool_output", "arguments": arguments},
            }
            if body.get("stream"):
                response = await self.open_stream(request)
                await response.write(chunk({"role": "assistant", "tool_calls": [{"index": 0, **call}]}))
                await response.write(chunk({}, finish="tool_calls") + b"data: [DONE]\n\n")
                return response
            return web.json_response(answer(None, [call]))
        return await self.tiny_deltas(request)

    async def open_stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        return response

    async def hostile(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._hostile(request)
        except ConnectionError:  # the proxy stopped reading, as it should
            return web.Response()

    async def _hostile(self, request: web.Request) -> web.StreamResponse:
        if self.scenario == "sse-line":
            response = await self.open_stream(request)
            await response.write(b'data: {"choices": [{"delta": {"content": "')
            for _ in range(100):
                await response.write(b"x" * MB)  # never a newline
            return response
        if self.scenario == "json-1gb":
            response = web.StreamResponse(headers={"content-type": "application/json"})
            response.content_length = 1024 * MB
            await response.prepare(request)
            await response.write(b'{"choices": [{"message": {"content": "' + b"x" * (MB - 38))
            for _ in range(1023):
                await response.write(b"x" * MB)
            return response
        return await self.tiny_deltas(request)

    async def tiny_deltas(self, request: web.Request) -> web.StreamResponse:
        response = await self.open_stream(request)
        if self.scenario == "tiny-arguments":
            opening = {"index": 0, "id": "call_big", "type": "function"}
            opening["function"] = {"name": "write_file", "arguments": ""}
            await response.write(chunk({"role": "assistant", "tool_calls": [opening]}))
            piece = chunk({"tool_calls": [{"index": 0, "function": {"arguments": "abcd"}}]})
            finish = "tool_calls"
        else:
            await response.write(chunk({"role": "assistant", "content": ""}))
            piece = chunk({"content": "abcd"})
            finish = "stop"
        batch = piece * 1000
        for _ in range(DELTA_TEXT_BYTES // 4000):
            await response.write(batch)
        await response.write(chunk({}, finish=finish) + b"data: [DONE]\n\n")
        return response


def history(names_outputs: bool) -> list[dict[str, Any]]:
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    if not names_outputs:
        return messages
    for i in range(8):
        messages += step(i, "\n".join(f"line {n} of output {i} " + "word " * 6 for n in range(120)))
    return messages


def peak_rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmHWM:\s+(\d+)", status)
    return int(found.group(1)) / 1024 if found else float("nan")


async def measure(proxy: ProxyProcess, stream: bool, names_outputs: bool) -> dict[str, Any]:
    body = {"model": "gpt-4o", "messages": history(names_outputs), "stream": stream}
    headers = {"authorization": f"Bearer {KEY}"}
    healthz: list[float] = []
    done = asyncio.Event()
    async with httpx.AsyncClient(base_url=proxy.url, timeout=120, trust_env=False) as client:

        async def poll() -> None:
            while not done.is_set():
                started = time.perf_counter()
                await client.get("/healthz")
                healthz.append((time.perf_counter() - started) * 1000)
                await asyncio.sleep(0.02)

        async def call() -> dict[str, Any]:
            started = time.perf_counter()
            received = 0
            async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
                async for part in response.aiter_bytes():
                    received += len(part)
                    tail = part[-400:]
            seconds = time.perf_counter() - started
            text = tail.decode(errors="replace")
            code = re.search(r'"code":\s*"([a-z_]+)"', text)
            return {
                "status": response.status_code,
                "seconds": seconds,
                "bytes": received,
                "error": code.group(1) if code else None,
            }

        poller = asyncio.create_task(poll())
        result = await call()
        done.set()
        await poller
    assert proxy.process is not None
    result.update(healthz_max_ms=max(healthz), peak_rss_mb=peak_rss_mb(proxy.process.pid))
    if stream and result["status"] == 200:
        result["sdk_seconds"] = await sdk_seconds(proxy, body)
    return result


async def sdk_seconds(proxy: ProxyProcess, body: dict[str, Any]) -> float:
    """The same request read the way an agent reads it: the openai SDK iterating the chunks."""
    client = openai.AsyncOpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=120)
    started = time.perf_counter()
    stream = await client.chat.completions.create(**body)
    async for _ in stream:
        pass
    await client.close()
    return time.perf_counter() - started


def run_scenario(upstream: Upstream, scenario: str, stream: bool, names_outputs: bool) -> dict[str, Any]:
    upstream.scenario = scenario
    with tempfile.TemporaryDirectory() as tmp:
        config = {
            "upstream": {"base_url": f"http://127.0.0.1:{upstream.port}/v1"},
            "policy": "improved",
            "context_windows": {"default": 8192},
            "state_dir": str(Path(tmp) / "state"),
            "logging": {"level": "warning", "format": "json"},
        }
        proxy = ProxyProcess(config, Path(tmp))
        proxy.start()
        try:
            return asyncio.run(measure(proxy, stream, names_outputs))
        finally:
            proxy.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--md-out", type=Path)
    args = parser.parse_args(argv)
    upstream = Upstream()
    upstream.start()
    scenarios = [
        ("one 100 MB SSE line in a read round (streamed)", "sse-line", True, True),
        ("a 1 GB JSON answer to a read round", "json-1gb", False, True),
        ("400 KB of text in 4-byte deltas after a read round", "tiny-deltas", True, True),
        ("the same text relayed plainly (no read round)", "tiny-deltas", True, False),
        ("400 KB of tool arguments in 4-byte deltas after a read round", "tiny-arguments", True, True),
        ("the same arguments relayed plainly", "tiny-arguments", True, False),
    ]
    rows = [(name, run_scenario(upstream, kind, stream, reads)) for name, kind, stream, reads in scenarios]
    upstream.stop()
    lines = [
        "| upstream answer | client got | time s (bytes) | time s (openai SDK) | bytes to client "
        "| peak RSS MB | /healthz max ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in rows:
        got = f"{r['status']}" + (f" `{r['error']}`" if r["error"] else "")
        sdk = f"{r['sdk_seconds']:.2f}" if "sdk_seconds" in r else "-"
        lines.append(
            f"| {name} | {got} | {r['seconds']:.2f} | {sdk} | {r['bytes']:,} | {r['peak_rss_mb']:.0f} "
            f"| {r['healthz_max_ms']:.1f} |"
        )
    lines.append("")
    for label, loop, plain in (("text", rows[2][1], rows[3][1]), ("tool arguments", rows[4][1], rows[5][1])):
        lines.append(
            f"Tiny deltas of {label} through a read loop vs the plain relay: "
            f"{loop['seconds'] / plain['seconds']:.2f}x the time read as bytes, "
            f"{loop['sdk_seconds'] / plain['sdk_seconds']:.2f}x read by the openai SDK."
        )
    report = "\n".join(lines)
    print(report)
    if args.md_out:
        args.md_out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
