"""Sessions and tenants, and the in-memory home of their checkpoints.

A tenant is a hash of the credential the client presents (``Authorization`` Bearer, Basic or
any other scheme, ``api-key``, ``x-api-key``), never the credential itself: different
credentials are different tenants, and a client that presents none is the anonymous tenant
(allowed only when no upstream key is configured, or the operator opts in). A session is
named by the client's ``X-Session-Id`` header, or else found from the conversation itself
(``proxy.state.session_index``): the first run of a task is a hash of the tenant, the system prompt
and the first user message.
"""

from __future__ import annotations

import asyncio
import hashlib
import unicodedata
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from policies.conversation import message_text, role
from policies.pipeline import Checkpoint
from proxy.wire.forwarding import header_value


def _digest(*parts: bytes) -> str:
    digest = hashlib.blake2b(digest_size=12)
    for part in parts:
        digest.update(part)
        digest.update(b"\x1f")
    return digest.hexdigest()


# Headers that carry a client's credential, for OpenAI-compatible APIs (Azure's ``api-key``),
# Anthropic's (``x-api-key``) and Google's (``x-goog-api-key``; a ``?key=`` is moved there).
CREDENTIAL_HEADERS = (b"authorization", b"api-key", b"x-api-key", b"x-goog-api-key")
ANONYMOUS = "t_anonymous"


def bearer_key(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    value = header_value(headers, b"authorization")
    if value and value[:7].lower() == b"bearer ":
        return value[7:].strip().decode("latin-1") or None
    return None


def credentials(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Every credential the client presents, as (header, value), non-empty values only."""
    found = []
    for name, value in headers:
        if name in CREDENTIAL_HEADERS and value.strip():
            found.append((name, value.strip()))
    return found


def tenant_of(headers: Sequence[tuple[bytes, bytes]]) -> str:
    """The tenant of whatever credential the client presents. A lone key is its tenant however
    it is sent (``Authorization: Bearer``, ``x-api-key``, ``api-key``: Claude Code and the
    Anthropic SDK send one key both ways), hashed as a bearer key always was (tenants stay stable
    across upgrades); several credentials, or another scheme, are hashed together with their
    header names, so no two different credentials share one."""
    found = credentials(headers)
    if not found:
        return ANONYMOUS
    key = None
    if len(found) == 1:
        name, value = found[0]
        key = bearer_key(found) if name == b"authorization" else value.decode("latin-1")
    if key:
        return "t_" + _digest(b"tenant", key.encode())
    return "t_" + _digest(b"tenant", *(b"%s=%s" % pair for pair in sorted(found)))


def explicit_session(tenant: str, session_id: str | bytes) -> str:
    """The proxy's id for a session the client named with ``X-Session-Id``."""
    # The header's raw bytes; an id typed as text (the events API) is taken as UTF-8.
    raw = session_id.encode("utf-8", "surrogatepass") if isinstance(session_id, str) else session_id
    return "s_" + _digest(tenant.encode(), b"explicit", raw)


# What a page or a table shows of a client's X-Session-Id: a client can send anything (up to
# the header limit), so the label is bounded and has no control characters. The proxy's own id
# is still the hash of the exact bytes.
CLIENT_SESSION_CHARS = 128


def client_session_label(raw: bytes | str) -> str:
    """The client's own session id as text fit to show: UTF-8 (invalid bytes replaced), control
    and format characters (newlines, bidi overrides) as ``?``, at most ``CLIENT_SESSION_CHARS``
    characters (the end cut to ``…``)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    if len(text) > CLIENT_SESSION_CHARS:
        text = text[: CLIENT_SESSION_CHARS - 1] + "\u2026"
    return "".join("?" if unicodedata.category(c)[0] == "C" else c for c in text.strip())


def client_session_of(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The label of the client's ``X-Session-Id``, if it sent one."""
    explicit = header_value(headers, b"x-session-id")
    return client_session_label(explicit) if explicit else None


def session_of(headers: Sequence[tuple[bytes, bytes]], body: Mapping[str, Any], tenant: str) -> str:
    explicit = header_value(headers, b"x-session-id")
    if explicit:
        return explicit_session(tenant, explicit)
    return root_session(body, tenant)


def root_session(body: Mapping[str, Any], tenant: str) -> str:
    """The session every run of one task starts in: a hash of the tenant, the system prompt
    and the first user message (``proxy.state.session_index`` tells parallel runs apart)."""
    messages = body.get("messages")
    system = first_user = ""
    if isinstance(messages, list):
        system = "\n".join(message_text(m) for m in messages if role(m) in ("system", "developer"))
        first_user = next((message_text(m) for m in messages if role(m) == "user"), "")
    return "s_" + _digest(
        tenant.encode(), b"derived", system.encode("utf-8", "replace"), first_user.encode("utf-8", "replace")
    )


class MemorySessions:
    """Checkpoints in memory (in front of the store), least recently used sessions evicted.

    Requests of one session are compacted one at a time (a lock per session), so two
    concurrent requests cannot both start a compaction from the same checkpoint.
    """

    def __init__(self, max_sessions: int = 10_000, *, shared: bool = False) -> None:
        """``shared``: other processes serve the same sessions, so a remembered checkpoint may
        be stale and every request reads the store instead."""
        self.max_sessions = max_sessions
        self.shared = shared
        self._checkpoints: OrderedDict[str, Checkpoint] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, session: str) -> asyncio.Lock:
        lock = self._locks.get(session)
        if lock is None:
            if len(self._locks) > 2 * self.max_sessions:
                self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            lock = self._locks[session] = asyncio.Lock()
        return lock

    def checkpoint(self, session: str) -> Checkpoint | None:
        if self.shared:
            return None
        found = self._checkpoints.get(session)
        if found is not None:
            self._checkpoints.move_to_end(session)
        return found

    def save(self, session: str, checkpoint: Checkpoint) -> None:
        self._checkpoints[session] = checkpoint
        self._checkpoints.move_to_end(session)
        while len(self._checkpoints) > self.max_sessions:
            self._checkpoints.popitem(last=False)
