"""``compaction-proxy``: serve the proxy, check a configuration, read events, replay recorded runs."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from policies.pipeline import PolicyConfigError, build_policies
from proxy.commands.model_coverage import uncovered_models
from proxy.commands.preflight import PreflightError, healthcheck, preflight
from proxy.commands.wrap import run_wrapped
from proxy.config.merge import policy_origins
from proxy.config.settings import (
    ENV_CONFIG,
    ConfigError,
    Settings,
    builtin_policies,
    load_settings,
    policy_specs,
    to_builtins,
)


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
    # A port in use, an unwritable state directory or a store that is down: one line, exit 1,
    # before anything is logged as started.
    preflight(settings)
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
        target: Any = "proxy.serving:app_from_environment"
    else:
        from proxy.app import create_app
        from proxy.telemetry.logs import configure_logging

        configure_logging(settings.logging.level, settings.logging.format)
        target = create_app(settings)
    # After the multiprocess set-up above: it loads the app (and prometheus-client).
    from proxy.serving import http_protocol, tune_gc, tune_threads

    tune_gc()
    tune_threads()

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


def _check(args: argparse.Namespace) -> int:
    settings = _load(args)
    resolved = to_builtins(settings)
    for section, secret in (("upstream", "api_key"), ("anthropic", "api_key"), ("server", "admin_token")):
        if resolved[section].get(secret):
            resolved[section][secret] = "<set>"
    sys.stdout.write(yaml.safe_dump(resolved, sort_keys=False))
    origins = policy_origins(_user_policies(args.config), builtin_policies())
    width = max(len(name) for name in settings.policies)
    lines = [f"# effective policies (default: {settings.policy}; per request: X-Compaction-Policy):"]
    for name, policy in settings.policies.items():
        stages = ", ".join(next(iter(stage)) for stage in policy.stages) or "no stages"
        lines.append(f"#   {name:<{width}}  {origins.get(name, 'built-in'):<22} {stages}")
    lines.append("# models table against the configured upstreams' usual model names:")
    upstreams = [settings.upstream.base_url, settings.anthropic.base_url]
    lines.extend(f"#   {line}" for line in uncovered_models(settings.context_windows, upstreams))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _user_policies(path: str | None) -> object:
    source = path or os.environ.get(ENV_CONFIG)
    if not source:
        return None
    loaded = yaml.safe_load(Path(source).read_text(encoding="utf-8")) or {}
    return loaded.get("policies") if isinstance(loaded, dict) else None


def _wrap(args: argparse.Namespace) -> int:
    settings = _load(args)
    arguments = args.args[1:] if args.args[:1] == ["--"] else args.args
    try:
        return run_wrapped(
            args.agent, arguments, settings=settings, config=args.config, url=args.url, as_json=args.json
        )
    except RuntimeError as exc:
        sys.stderr.write(f"compaction-proxy: {exc}\n")
        return 1


def _healthcheck(args: argparse.Namespace) -> int:
    healthy, detail = healthcheck(_load(args))
    sys.stdout.write(detail + "\n")
    return 0 if healthy else 1


def _events(args: argparse.Namespace) -> int:
    from proxy.commands.events import run_events
    from proxy.state.store_factory import make_store

    settings = _load(args)
    return run_events(args, settings, make_store(settings))


def _canary(args: argparse.Namespace) -> int:
    from proxy.commands.canary import run_canary
    from proxy.state.store_factory import make_store

    settings = _load(args)
    return run_canary(args, settings, make_store(settings))


# Commands that live in other packages, registered by name and imported only when asked for,
# so that `serve` never loads them (a test checks it).
EXTENSIONS: dict[str, tuple[str, str]] = {
    "replay": ("replay.cli", "replay recorded trajectories through the proxy (see: replay --help)"),
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compaction-proxy", description=__doc__)
    parser.add_argument("--version", action="version", version=f"compaction-proxy {version()}")
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
    events.add_argument("--session", help="your X-Session-Id, or the proxy's session id (s_...)")
    events.add_argument("--tenant", help="the proxy's tenant id (t_...)")
    events.add_argument("--policy", help="only events of this policy")
    events.add_argument("--since", help="unix seconds, ISO time, or a duration back from now (15m, 2h, 1d)")
    events.add_argument("--limit", type=int, default=1000, help="at most this many events per read")
    events.add_argument("--follow", action="store_true", help="keep printing new events as they arrive")
    events.add_argument("--interval", type=float, default=1.0, help="seconds between reads with --follow")
    events.set_defaults(run=_events)
    canary = commands.add_parser(
        "canary",
        help="the canary's arms side by side and the gate's verdict (status), or lift a pause (resume)",
    )
    canary.add_argument("action", choices=("status", "resume"))
    canary.add_argument("--config", help="YAML settings file (locates the store)")
    canary.add_argument("--json", action="store_true", help="print the report as one JSON object")
    canary.set_defaults(run=_canary)
    health = commands.add_parser(
        "healthcheck", help="exit 0 if the proxy of this configuration answers /readyz (for containers)"
    )
    health.add_argument("--config", help="YAML settings file (default: $COMPACTION_PROXY_CONFIG)")
    health.add_argument("--port", type=int, help="the port it listens on (default: the configured one)")
    health.set_defaults(run=_healthcheck)
    wrap = commands.add_parser(
        "wrap",
        help="run an agent through the proxy and print what it did: wrap claude|codex|COMMAND -- ARGS",
        description="Runs AGENT through the proxy answering at --url or at the configured address, "
        "else one started for the run; prints what the proxy did when the agent exits.",
    )
    wrap.add_argument("--config", help="YAML settings file of a proxy started for the run")
    wrap.add_argument("--url", help="use the proxy answering here (e.g. http://127.0.0.1:8080)")
    wrap.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    wrap.add_argument(
        "agent", help="claude, codex, or any command (given OPENAI_BASE_URL and ANTHROPIC_BASE_URL)"
    )
    wrap.add_argument("args", nargs=argparse.REMAINDER, help="the agent's arguments, after --")
    wrap.set_defaults(run=_wrap)
    demo = commands.add_parser(
        "demo",
        help="see compaction in seconds: a scripted agent session, no key needed",
        description="Plays a scripted coding-agent session through a real proxy (serve, on a free "
        "loopback port, the built-in policy) against a built-in stand-in model with a small window, "
        "and prints what compaction did. No key, no config file, no network; it stops all it starts.",
    )
    demo.add_argument("--keep", action="store_true", help="keep the proxy and /ui running until Ctrl-C")
    demo.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    demo.set_defaults(
        run=lambda args: importlib.import_module("proxy.commands.demo").run_demo(
            keep=args.keep, as_json=args.json
        )
    )
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
    except PreflightError as exc:
        sys.stderr.write(f"compaction-proxy: {exc}\n")
        return 1


def version() -> str:
    try:
        return importlib.metadata.version("compaction-proxy")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


if __name__ == "__main__":
    raise SystemExit(main())
