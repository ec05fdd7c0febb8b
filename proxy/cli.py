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

from policies.pipeline import PolicyConfigError, build_policies
from proxy.commands.preflight import PreflightError, healthcheck, preflight
from proxy.commands.wrap import run_wrapped
from proxy.config.settings import (
    ENV_CONFIG,
    ConfigError,
    Settings,
    load_settings,
    policy_specs,
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
    from proxy.commands.check_config import run_check

    return run_check(args, _load(args))


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
    if not args.config and args.session:
        # A wrap run's events are in the store its proxy used, wherever this is run from.
        from proxy.commands.wrap_runs import run_settings

        found = run_settings(args.session, os.environ)
        if found is not None:
            settings, where = found
            sys.stderr.write(f"compaction-proxy: reading {where}\n")
    if settings.store.backend == "sqlite":
        path = Path(settings.store.path or Path(settings.state_dir) / "compaction.db")
        if not path.exists():
            # Reading must not leave an empty store behind where no proxy ever ran.
            sys.stderr.write(
                f"compaction-proxy events: no store at {path}: run it in the directory `serve` runs "
                "in, or pass that proxy's --config\n"
            )
            return 1
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


def _add_events(commands: Any) -> None:
    events = commands.add_parser(
        "events",
        help="print compaction events from the store, newest first (a table on a terminal)",
        description="Compaction events read from the store of the configuration, newest first: "
        "a table on a terminal, JSON lines (one whole event each) when piped or with --json. "
        "With --follow, the newest --limit first, then new events as they arrive, oldest first.",
    )
    events.add_argument("--config", help="YAML settings file (locates the store)")
    events.add_argument("--session", help="your X-Session-Id, or the proxy's session id (s_...)")
    events.add_argument("--tenant", help="the proxy's tenant id (t_...)")
    events.add_argument("--policy", help="only events of this policy")
    events.add_argument("--since", help="unix seconds, ISO time, or a duration back from now (15m, 2h, 1d)")
    events.add_argument("--limit", type=int, default=1000, help="at most this many events (the newest)")
    events.add_argument("--follow", action="store_true", help="keep printing new events as they arrive")
    events.add_argument("--interval", type=float, default=1.0, help="seconds between reads with --follow")
    form = events.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="JSON lines, one whole event each (as when piped)")
    form.add_argument("--table", action="store_true", help="the table, even when piped")
    events.set_defaults(run=_events)


def _add_canary(commands: Any) -> None:
    canary = commands.add_parser(
        "canary",
        help="the canary's arms side by side and the gate's verdict (status), or lift a pause (resume)",
        description="Canary mode from the store of the configuration: `status` shows the arms "
        "and the gate's verdict, `resume` lifts a pause.",
    )
    actions = canary.add_subparsers(dest="action", required=True, metavar="{status,resume}")
    status = actions.add_parser(
        "status",
        help="the arms side by side and the gate's verdict: exit 0 pass, 2 waiting, 3 breached or paused",
        description="The canary's treated and holdout arms side by side and the gate's verdict, "
        "from the store of the configuration. Exit 0: pass; 2: waiting for sessions; 3: breached "
        "or paused.",
    )
    resume = actions.add_parser(
        "resume",
        help="lift a pause: new sessions get the policy again and the gate starts a new epoch",
        description="Lifts the canary's pause: new sessions get the policy again, and the gate "
        "judges the sessions seen from now on (a new epoch), not the ones that tripped it.",
    )
    for parser in (canary, status, resume):
        # Before or after the action, as when it was a positional (`canary --config x status`).
        parser.add_argument(
            "--config", default=argparse.SUPPRESS, help="YAML settings file (locates the store)"
        )
    for parser in (canary, status):
        parser.add_argument(
            "--json",
            action="store_true",
            default=argparse.SUPPRESS,
            help="print the report as one JSON object",
        )
    canary.set_defaults(run=_canary, config=None, json=False)


def _describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand without a description its one-line help as one, so that
    `X --help` says what X does (argparse shows a subcommand's help only in its parent's list)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            summaries = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                summary = summaries.get(name)
                if not sub.description and summary:
                    sub.description = summary[:1].upper() + summary[1:] + "."
                _describe(sub)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy",
        description="Serve the proxy, check a configuration, read events, run the canary, wrap an "
        "agent, replay recorded runs. `compaction-proxy COMMAND --help` says more of each.",
    )
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
        "check-config",
        help="validate settings; print the effective policies, models coverage and a verdict",
        description="Validates the settings (a file, the environment, the built-ins) and the "
        "policies, prints the effective policies and where each comes from, the models table "
        "against the configured upstreams' usual model names, and ends with one verdict line "
        "(OK, or what to look at). A bad configuration is one line on stderr and exit 2.",
    )
    check.add_argument("--config", help="YAML settings file")
    check.add_argument(
        "--full", action="store_true", help="print every setting resolved first (YAML, secrets hidden)"
    )
    check.set_defaults(run=_check)
    _add_events(commands)
    _add_canary(commands)
    health = commands.add_parser(
        "healthcheck", help="exit 0 if the proxy of this configuration answers /readyz (for containers)"
    )
    health.add_argument("--config", help="YAML settings file (default: $COMPACTION_PROXY_CONFIG)")
    health.add_argument("--port", type=int, help="the port it listens on (default: the configured one)")
    health.set_defaults(run=_healthcheck)
    wrap = commands.add_parser(
        "wrap",
        help="run an agent (claude, codex, gemini, opencode, aider, qwen, goose, any) through the proxy",
        description="Runs AGENT through the proxy at --url, or the one at the configured address "
        "if it runs this configuration, else one started for the run; prints what the proxy did "
        "when the agent exits. Its exit status is the agent's.",
    )
    wrap.add_argument(
        "--config", help="YAML settings file (the proxy at its address must run it, or one is started)"
    )
    wrap.add_argument(
        "--url", help="use the compaction-proxy answering here, whatever its configuration (said)"
    )
    wrap.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    wrap.add_argument(
        "agent",
        help="claude, codex, gemini, opencode, aider, qwen, goose, or any command "
        "(given OPENAI_BASE_URL and ANTHROPIC_BASE_URL)",
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
    _describe(parser)
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
