"""``compaction-proxy wrap AGENT [-- ARGS]``: run a coding agent through the proxy in one command.

It uses the proxy at ``--url``, or the one at the configured address when it runs the very
configuration given (``wrap_proxy``: anything else is refused rather than handed the agent's
key), else starts one for the run; points the agent at it the way that agent reads a base URL,
in the run's session (``wrap_agents``); runs the agent in the foreground with the signals sent
to wrap passed on (``wrap_signals``); and when the agent exits prints what the proxy did
(``wrap_summary``) and stops the proxy it started, by its PID, whichever way wrap ends. wrap's
exit status is the agent's, as a shell reports it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Sequence

from proxy.commands.wrap_agents import agent_wiring
from proxy.commands.wrap_proxy import (
    Identity,
    Proxy,
    WrapRefused,
    chosen_proxy,
    identify,
    state_home,
    wrap_directory,
)
from proxy.commands.wrap_runs import SESSION_PREFIX, record_run
from proxy.commands.wrap_signals import Signalled, run_agent, signals_stop_wrap
from proxy.commands.wrap_summary import Figures, RunFacts, parse_figures, summary_json, summary_lines
from proxy.config.settings import Settings

__all__ = ["WrapRefused", "run_wrapped"]


def new_session() -> str:
    return f"{SESSION_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _say(text: str) -> None:
    # After a hangup the terminal is gone: what wrap has to say must not stop it stopping the proxy.
    with contextlib.suppress(OSError):
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


def run_wrapped(
    agent: str,
    args: Sequence[str],
    *,
    settings: Settings,
    config: str | None,
    url: str | None,
    as_json: bool,
) -> int:
    """Run ``agent`` through a proxy; print what it did; the agent's exit status (128 + N for
    an agent a signal ended, and for wrap signalled before the agent ran)."""
    proxy: Proxy | None = None
    try:
        with signals_stop_wrap():
            proxy = chosen_proxy(settings, config, url, wrap_directory(os.environ))
            if proxy.note:
                _say(f"compaction-proxy: {proxy.note}")
            session = new_session()
            record_run(
                state_home(os.environ),
                session,
                config=config,
                proxy_cwd=proxy.log_path.parent if proxy.log_path else None,
                proxy_url=proxy.base,
            )
            before = parse_figures(proxy.metrics())
            environment, command = agent_wiring(agent, args, proxy.base, session, os.environ)
            try:
                code = run_agent(command, environment)
            except FileNotFoundError:
                _say(f"compaction-proxy: {agent}: command not found")
                return 127
            _summarize(proxy, session, parse_figures(proxy.metrics()).minus(before), as_json=as_json)
        return code
    except Signalled as stopped:
        return 128 + stopped.signum
    finally:
        if proxy is not None:
            proxy.stop()


def _summarize(proxy: Proxy, session: str, ran: Figures, *, as_json: bool) -> None:
    identity = proxy.identity
    now = identify(proxy.base)  # what its upstreams told it during the run
    facts = RunFacts(
        session=session,
        proxy_url=proxy.base,
        shared=not proxy.started_here,
        log_path=proxy.log_path,
        policy=identity.policy,
        mode=identity.mode,
        windows=identity.windows,
        events_command=f"compaction-proxy events --session {session}",
        learned=now.learned if isinstance(now, Identity) else {},
    )
    _say(summary_json(ran, facts).decode() if as_json else "\n".join(summary_lines(ran, facts)))
