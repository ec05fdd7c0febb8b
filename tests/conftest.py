"""Shared fixtures. Tests cannot reach the network by accident: any connection to an
address outside loopback raises, and the proxy's environment variables of the developer's
shell are ignored."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from replay.session.proxy_process import ProxyProcess as ChildProxy
from tests import redis_server
from tests.fake_upstream import FakeUpstream

ROOT = Path(__file__).resolve().parent.parent

# Property tests draw the same examples on every run and every machine ("fixed": seeded from
# each test function, no example database), so a submission cannot turn red by the luck of
# its draw or by a database left on a machine. "explore" draws afresh each run: .ci/nightly
# runs the property suites that way, with its seed printed so any find can be replayed.
hypothesis_settings.register_profile("fixed", derandomize=True, database=None, print_blob=True)
hypothesis_settings.register_profile("explore", derandomize=False, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))
_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _check_address(address: Any) -> None:
    if isinstance(address, tuple) and address:
        host = address[0]
        if host in ("localhost",):
            return
        try:
            if ipaddress.ip_address(host).is_loopback:
                return
        except ValueError:
            pass
        raise ConnectionRefusedError(f"tests may only connect to loopback, not {host!r}")


def _guarded_connect(self: socket.socket, address: Any) -> None:
    _check_address(address)
    _real_connect(self, address)


def _guarded_connect_ex(self: socket.socket, address: Any) -> int:
    _check_address(address)
    return _real_connect_ex(self, address)


@pytest.fixture(autouse=True, scope="session")
def _loopback_only() -> Iterator[None]:
    socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]
    for variable in [v for v in os.environ if v.startswith("COMPACTION_PROXY_")]:
        del os.environ[variable]
    # Every body read from its conversation's known prefix is compared with its whole parse
    # (in this process and in every proxy it starts): a parsed body changed in place by the
    # proxy would make the next one differ.
    os.environ["CPX_VERIFY_KNOWN_BODIES"] = "1"
    yield
    socket.socket.connect = _real_connect  # type: ignore[method-assign]
    socket.socket.connect_ex = _real_connect_ex  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def upstream_server() -> Iterator[FakeUpstream]:
    server = FakeUpstream().start()
    yield server
    server.stop()


@pytest.fixture
def upstream(upstream_server: FakeUpstream) -> FakeUpstream:
    upstream_server.reset()
    return upstream_server


class ProxyProcess(ChildProxy):
    """The real proxy (``compaction-proxy serve``) as a subprocess on a free loopback port,
    with its state in ``tmp/state`` unless given."""

    def __init__(
        self,
        config: dict[str, Any],
        tmp: Path,
        env: dict[str, str] | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.state_dir = state_dir or tmp / "state"
        config = {**config, "state_dir": str(self.state_dir)}
        config.setdefault("logging", {"level": "info", "format": "json"})
        super().__init__(config, tmp, env, config_name="config.yml")

    def start(self, timeout: float = 20.0) -> ProxyProcess:
        super().start(timeout)
        return self

    def log_lines(self) -> list[str]:
        return self.log_path.read_text().splitlines()


# CPX_TEST_STORE=redis runs the end-to-end suite with every proxy on a shared Redis store.
REDIS_SUITE = os.environ.get("CPX_TEST_STORE") == "redis"


def store_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    if not REDIS_SUITE:
        return {}
    return {"store": {"backend": "redis", "redis_url": request.getfixturevalue("redis_url")}}


@pytest.fixture(autouse=True)
def _fresh_redis(request: pytest.FixtureRequest) -> None:
    """In the Redis suite, every test starts from an empty Redis."""
    if REDIS_SUITE and "start_proxy" in request.fixturenames:
        import redis

        redis.Redis.from_url(request.getfixturevalue("redis_url")).flushall()


@pytest.fixture
def start_proxy(tmp_path: Path, upstream: FakeUpstream, request: pytest.FixtureRequest) -> Iterator[Any]:
    started: list[ProxyProcess] = []
    base = store_config(request)

    def start(
        config: dict[str, Any] | None = None, env: dict[str, str] | None = None, state_dir: Path | None = None
    ) -> ProxyProcess:
        merged: dict[str, Any] = {
            "upstream": {"base_url": upstream.base_url},
            "anthropic": {"base_url": upstream.base_url},
            **base,
        }
        for key, value in (config or {}).items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
        directory = tmp_path / f"proxy{len(started)}"
        directory.mkdir()
        proxy = ProxyProcess(merged, directory, env, state_dir).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


@pytest.fixture(scope="session")
def shared_proxy(
    tmp_path_factory: pytest.TempPathFactory, upstream_server: FakeUpstream, request: pytest.FixtureRequest
) -> Iterator[ProxyProcess]:
    """One proxy with the default settings for all tests that need nothing else."""
    proxy = ProxyProcess(
        {
            "upstream": {"base_url": upstream_server.base_url},
            "anthropic": {"base_url": upstream_server.base_url},
            **store_config(request),
        },
        tmp_path_factory.mktemp("proxy"),
    ).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def proxy(shared_proxy: ProxyProcess, upstream: FakeUpstream) -> ProxyProcess:
    return shared_proxy


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server (Debian's, installed by .ci/run) on a free loopback port."""
    process, port = redis_server.start_on_a_free_port(tmp_path_factory.mktemp("redis"))
    yield f"redis://127.0.0.1:{port}/0"
    redis_server.stop(process)
