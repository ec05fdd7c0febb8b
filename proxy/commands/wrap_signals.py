"""Running the agent under ``wrap``: its signals, and its exit status as a shell reports it.

The agent shares wrap's process group, so the terminal's Ctrl-C (and its hangup) reach it
directly. A signal sent to wrap alone (``kill -TERM``, a supervisor, a closed SSH session
sending SIGHUP to wrap) is passed on to the agent. wrap never ignores SIGINT itself, since an
ignored signal stays ignored across exec and the agent (a shell script, a Python agent) could
then not be interrupted: it catches the signals with a handler, which exec resets.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The kernel's si_code for a signal it sent itself: the terminal's Ctrl-C or hangup, which
# reached the agent's process group too.
SI_KERNEL = 0x80


class Signalled(Exception):
    """wrap was signalled before the agent ran (the run's proxy is then stopped)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def shell_status(returncode: int) -> int:
    """An exit status as a shell reports it: 128 + the signal's number for a process a signal
    ended (subprocess says -N), else its own code."""
    return 128 - returncode if returncode < 0 else returncode


def _raise(signum: int, _frame: FrameType | None) -> None:
    raise Signalled(signum)


@contextlib.contextmanager
def signals_stop_wrap() -> Iterator[None]:
    """Until the agent starts, SIGINT, SIGTERM and SIGHUP raise ``Signalled`` instead of ending
    wrap at once, so the proxy it started is stopped on the way out."""
    previous = {signum: signal.signal(signum, _raise) for signum in FORWARDED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_agent(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run the agent in the foreground, pass it the signals sent to wrap, and return its exit
    status as a shell reports it. Raises ``FileNotFoundError`` for a missing command."""
    pending: list[int] = []
    # Recorded, not raised, from here: the agent may have started by the time one arrives.
    previous = {signum: signal.signal(signum, lambda n, _f: pending.append(n)) for signum in FORWARDED}
    try:
        agent = subprocess.Popen(list(command), env=dict(env))
        if hasattr(signal, "sigtimedwait"):
            return shell_status(_wait_with_siginfo(agent, pending))
        return shell_status(_wait_with_handlers(agent, pending))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _wait_with_siginfo(agent: subprocess.Popen[bytes], pending: list[int]) -> int:
    """Linux: signals are taken synchronously with who sent them, so one the terminal sent
    the whole group (the agent has it already) is not sent twice: a second Ctrl-C would end
    an interactive agent that asks for two."""
    watched = {*FORWARDED, signal.SIGCHLD}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        while agent.poll() is None:
            # Caught by the handler before the mask was set: the sender is not known, so sent on.
            while pending:
                _send(agent, pending.pop(0))
            info = signal.sigtimedwait(watched, 1.0)
            if info is not None and info.si_signo != signal.SIGCHLD and info.si_code != SI_KERNEL:
                _send(agent, info.si_signo)
        return agent.returncode
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _wait_with_handlers(agent: subprocess.Popen[bytes], pending: list[int]) -> int:
    """Elsewhere (no ``sigtimedwait``): every signal wrap gets is passed on but the terminal's
    SIGINT, which a wrap in the terminal's foreground shares with the agent."""
    while True:
        while pending:
            signum = pending.pop(0)
            if signum != signal.SIGINT or not _in_foreground():
                _send(agent, signum)
        try:
            return agent.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue


def _in_foreground() -> bool:
    try:
        return os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def _send(agent: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        agent.send_signal(signum)
