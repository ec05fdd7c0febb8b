"""A Node agent's conversation, written by Node itself: ``JSON.stringify`` of a history whose tool
outputs were cut with ``.slice(0, n)`` through an emoji, as Node agents truncate outputs by
UTF-16 length. The real proxy at a small window compacts it (no ``x-compaction-skipped``), the
upstream receives valid JSON with each lone surrogate as its escape, and ``read_tool_output``
reads such an output back with its lone surrogate."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import httpx
import pytest

from tests.fake_upstream import FakeUpstream, Recorded, Reply, completion
from tests.needs import REQUIRE_CLIENTS, unavailable

pytestmark = pytest.mark.e2e

HANDLE = re.compile(r"handle=(out_[0-9a-f]+)")
# Each output is cut at a line ending in an emoji, one UTF-16 unit into it: half its pair.
NODE_AGENT = r"""
const messages = [{ role: "user", content: "Fix the failing tests." }];
for (let i = 0; i < 8; i++) {
  const lines = [];
  for (let n = 0; n < 200; n++) lines.push(`line ${n} of step ${i} 😀`);
  lines[3] = `CUT-${i} 😀`;
  const full = lines.join("\n");
  const cut = full.slice(0, full.indexOf(`CUT-${i} `) + `CUT-${i} `.length + 1);
  const call = { id: `call_${i}`, type: "function", function: { name: "bash", arguments: '{"c":"t"}' } };
  messages.push({ role: "assistant", content: null, tool_calls: [call] });
  messages.push({ role: "tool", tool_call_id: `call_${i}`, content: cut + full.slice(cut.length + 1) });
}
process.stdout.write(JSON.stringify({ model: "gpt-4o", messages }));
"""


def node_body() -> bytes:
    node = shutil.which("node")
    if node is None:
        unavailable("node", "install Node.js 20 (apt-get install nodejs)", required_by=REQUIRE_CLIENTS)
    return subprocess.run([node, "-e", NODE_AGENT], check=True, capture_output=True, timeout=30).stdout


def read_cut_lines(request: Recorded) -> Reply:
    handle = HANDLE.findall(request.body.decode())[0]
    arguments = json.dumps({"handle": handle, "pattern": "CUT-"})
    call = {"id": "r1", "type": "function", "function": {"name": "read_tool_output", "arguments": arguments}}
    return Reply(body=completion(tool_calls=[call]))


def test_a_node_agents_cut_outputs_are_compacted_and_read_back(
    start_proxy: Any, upstream: FakeUpstream
) -> None:
    content = node_body()
    assert b"CUT-0 \\ud83d\\n" in content  # Node's well-formed JSON.stringify: the escape
    client = json.loads(content)
    proxy = start_proxy({"policy": "improved", "context_windows": {"default": 8192}})
    upstream.queue(Reply(dynamic=read_cut_lines), Reply(body=completion("done")))
    answer = httpx.post(
        proxy.base_url + "/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "done"
    headers = answer.headers
    assert "x-compaction-skipped" not in headers
    assert headers["x-compaction-trigger"] == "threshold" and headers["x-compaction-read-rounds"] == "1"
    assert int(headers["x-compaction-tokens-after"]) < int(headers["x-compaction-tokens-before"])
    first, second = upstream.requests
    for sent in (first, second):
        assert b"\xf4\x8f" not in sent.body and b"\\ud83d" in sent.body  # the escape, no mark
    view = json.loads(first.body)  # valid JSON
    assert view["messages"][-1] == client["messages"][-1]  # untouched: the lone surrogate too
    read = json.loads(second.body)["messages"][-1]
    assert read["role"] == "tool" and "CUT-0 \ud83d" in read["content"]
