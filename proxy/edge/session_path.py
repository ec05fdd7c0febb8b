"""A session named in the base URL: ``/s/<session>/v1/...`` is ``/v1/...`` with the header
``X-Session-Id: <session>``.

For a client that cannot send a header of its own (a plain SDK script, an agent whose
provider settings take a base URL only), the session rides in the path: its base URL is
``http://host:port/s/<session>/v1`` (or ``.../s/<session>`` for an Anthropic-style client,
which appends ``/v1/messages``). The prefix is stripped before anything else sees the request,
so every route treats it exactly as the header; a client that sends its own ``X-Session-Id``
keeps it (a client that names its conversations knows them better than its base URL does).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

PREFIX = "/s/"
# One path segment of the characters an id needs (no percent-encoding, nothing a header
# could not carry), at most 200 of them.
_SESSION = re.compile(rb"[A-Za-z0-9._~:@+=-]{1,200}")


def with_path_session(scope: Mapping[str, Any]) -> Mapping[str, Any]:
    """``scope`` with a ``/s/<session>`` prefix moved into an ``x-session-id`` header; any
    other scope as it is (a malformed prefix too: it then finds no route)."""
    if not scope["path"].startswith(PREFIX):
        return scope
    raw: bytes = scope.get("raw_path") or scope["path"].encode()
    raw = raw.split(b"?", 1)[0]
    session, _, rest = raw[len(PREFIX) :].partition(b"/")
    if not _SESSION.fullmatch(session):
        return scope
    raw_path = b"/" + rest
    headers = list(scope["headers"])
    if not any(name == b"x-session-id" for name, _ in headers):
        headers.append((b"x-session-id", session))
    return {
        **scope,
        "path": urllib.parse.unquote(raw_path.decode("latin-1")),
        "raw_path": raw_path,
        "headers": headers,
    }
