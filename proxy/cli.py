"""``compaction-proxy``: serve the proxy, check a configuration, read events, replay recorded runs."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from policies.pipeline import PolicyConfigError, build_policies
from proxy.settings import ENV_CONFIG, ConfigError, Settings, load_settings, policy_specs, to_builtins


def _load(args: argparse.Namespace) -> Settings:
    overrides = {"server.host": getattr(args, "host", None), "server.port": getattr(args, "port", None)}
    settings = load_settings(args.config, overrides=overrides)
    # Policies are validated at start-up too, so a bad stage stops the start here.
    build_policies(policy_specs(settings))
    return settings


ENV_OVERRIDES = "COMPACTION_PROXY_OVERRIDES"
ENV_MULTIPROC = "PROMETHEUS_MULTIPROC_DIR"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    settings = _load(args)
    workers = settings.server.workers
    if workers > 1:
        # Several processes: prometheus-client's multiprocess mode, set up before it is
        # imported; each worker builds the app from the same file and overrides.
        metrics_dir = Path(settings.state_dir) / "prometheus-multiproc"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True, mode=0o700)
        os.environ[ENV_MULTIPROC] = str(metrics_dir)
        if args.config:
            os.environ[ENV_CONFIG] = str(Path(args.config).resolve())
        os.environ[ENV_OVERRIDES] = orjson.dumps(
            {"server.host": args.host, "server.port": args.port}
        ).decode()
        target: Any = "proxy.app:app_from_environment"
    else:
        from proxy.app import create_app
        from proxy.logs import configure_logging

        configure_logging(settings.logging.level, settings.logging.format)
        target = create_app(settings)
    uvicorn.run(
        target,
        factory=workers > 1,
        workers=workers,
        host=settings.server.host,
        port=settings.server.port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http=http_protocol(settings),
        h11_max_incomplete_event_size=settings.server.max_header_bytes,
        lifespan="on",
        access_log=False,
        log_config=None,
        # The upstream's own Server and Date headers are relayed; ours would replace them.
        server_header=False,
        date_header=False,
        timeout_keep_alive=75,
        # X-Forwarded-* from clients is not trusted: nothing here depends on client addresses.
        proxy_headers=False,
    )
    return 0


def http_protocol(settings: Settings) -> Any:
    """uvicorn's httptools protocol with header size and read deadlines (h11 if httptools is
    missing: it bounds the headers' size only)."""
    if not importlib.util.find_spec("httptools"):
        return "h11"
    from proxy.server_protocol import LimitedHttpToolsProtocol

    server = settings.server
    LimitedHttpToolsProtocol.configure(
        max_header_bytes=server.max_header_bytes,
        header_timeout=server.header_timeout_seconds,
        body_timeout=server.body_timeout_seconds,
    )
    return LimitedHttpToolsProtocol


def _check(args: argparse.Namespace) -> int:
    settings = _load(args)
    resolved = to_builtins(settings)
    for section, secret in (("upstream", "api_key"), ("anthropic", "api_key"), ("server", "admin_token")):
        if resolved[section].get(secret):
            resolved[section][secret] = "<set>"
    sys.stdout.write(yaml.safe_dump(resolved, sort_keys=False))
    return 0


def _parse_since(value: str | None) -> float:
    """Unix seconds, an ISO time, or a duration back from now such as 90s, 15m, 2h, 1d."""
    if not value:
        return 0.0
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[-1] in units and value[:-1].replace(".", "", 1).isdigit():
        return time.time() - float(value[:-1]) * units[value[-1]]
    try:
        return float(value)
    except ValueError:
        return datetime.datetime.fromisoformat(value).timestamp()


def _events(args: argparse.Namespace) -> int:
    from proxy.app import make_store

    settings = _load(args)
    store = make_store(settings)
    since = _parse_since(args.since)
    seen: set[str] = set()

    async def run() -> None:
        nonlocal since
        try:
            while True:
                found = await store.events(
                    args.tenant, session=args.session, policy=args.policy, since=since, limit=args.limit
                )
                for event in found:
                    if event["event_id"] not in seen:
                        seen.add(event["event_id"])
                        sys.stdout.write(orjson.dumps(event).decode() + "\n")
                        since = max(since, float(event["time"]))
                sys.stdout.flush()
                if not args.follow:
                    return
                await asyncio.sleep(args.interval)
        finally:
            await store.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


# Commands that live in other packages, registered by name and imported only when asked for,
# so that `serve` never loads them (a test checks it).
EXTENSIONS: dict[str, tuple[str, str]] = {
    "replay": ("replay.cli", "replay recorded trajectories through the proxy (see: replay --help)"),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compaction-proxy", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument(
        "--config", help="YAML settings file (default: $COMPACTION_PROXY_CONFIG, else built-ins)"
    )
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080)")
    serve.set_defaults(run=_serve)
    check = commands.add_parser(
        "check-config", help="validate settings and print them resolved (secrets hidden)"
    )
    check.add_argument("--config", help="YAML settings file")
    check.set_defaults(run=_check)
    events = commands.add_parser("events", help="print compaction events from the store as JSON lines")
    events.add_argument("--config", help="YAML settings file (locates the store)")
    events.add_argument("--session", help="the proxy's session id (s_...), as in the events")
    events.add_argument("--tenant", help="the proxy's tenant id (t_...)")
    events.add_argument("--policy", help="only events of this policy")
    events.add_argument("--since", help="unix seconds, ISO time, or a duration back from now (15m, 2h, 1d)")
    events.add_argument("--limit", type=int, default=1000, help="at most this many events per read")
    events.add_argument("--follow", action="store_true", help="keep printing new events as they arrive")
    events.add_argument("--interval", type=float, default=1.0, help="seconds between reads with --follow")
    events.set_defaults(run=_events)
    wanted = (list(argv) if argv is not None else sys.argv[1:])[:1]
    for name, (module, summary) in EXTENSIONS.items():
        if wanted == [name]:
            importlib.import_module(module).register(commands)
        else:
            # Listed in --help; the real parser is built when the command is used.
            commands.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    try:
        code: int = args.run(args)
        return code
    except (ConfigError, PolicyConfigError) as exc:
        sys.stderr.write(f"compaction-proxy: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
