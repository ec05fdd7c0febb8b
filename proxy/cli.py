"""``compaction-proxy``: serve the proxy, or check a configuration."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence

import yaml

from policies.pipeline import PolicyConfigError, build_policies
from proxy.settings import ConfigError, Settings, load_settings, policy_specs, to_builtins


def _load(args: argparse.Namespace) -> Settings:
    overrides = {"server.host": getattr(args, "host", None), "server.port": getattr(args, "port", None)}
    settings = load_settings(args.config, overrides=overrides)
    # Policies are validated at start-up too, so a bad stage stops the start here.
    build_policies(policy_specs(settings))
    return settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy.app import create_app
    from proxy.logs import configure_logging

    settings = _load(args)
    configure_logging(settings.logging.level, settings.logging.format)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
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
    uvicorn.Server(config).run()
    return 0


def _check(args: argparse.Namespace) -> int:
    settings = _load(args)
    resolved = to_builtins(settings)
    for section, secret in (("upstream", "api_key"), ("server", "admin_token")):
        if resolved[section].get(secret):
            resolved[section][secret] = "<set>"
    sys.stdout.write(yaml.safe_dump(resolved, sort_keys=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
        return code
    except (ConfigError, PolicyConfigError) as exc:
        sys.stderr.write(f"compaction-proxy: {exc}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
