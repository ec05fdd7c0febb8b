"""Reading a request's body: the route's ``read`` step, apart from its trace phase."""

from __future__ import annotations

from proxy.route.draft import UNREADABLE, Draft, why_unreadable
from proxy.route.known_bodies import KnownBodies
from proxy.route.large_requests import LargeRequests
from proxy.wire.json_body import SentAsIs


async def read_body(draft: Draft, bodies: KnownBodies, large: LargeRequests) -> bool:
    """The body parsed from where it stops repeating the conversation's last one, put back by
    the door's ``restore`` hook, and read by the dialect; a large one left to a worker process
    (True: the route goes on). An unreadable body goes as sent, never a 500."""
    try:
        door = draft.dialect
        body = bodies.read(draft.tenant, door, draft.headers, draft.content)
        if large.wants_parsed(body.data):
            return True  # a worker process reads it again, and compacts it
        data, restored = await door.restore(draft.tenant, body.data)
        draft.parsed = door.parse(data, 0 if restored else body.known)
        draft.marked = body.marked
        if draft.parsed.skipped is None and not restored:
            body.checked()
            draft.wire = body.record
    except (SentAsIs, *UNREADABLE) as exc:
        return draft.as_sent(why_unreadable(draft.dialect.name, exc))
    if restored:
        draft.parsed.notes["restored_read_rounds"] = restored
        draft.restored = data
    draft.skipped = draft.parsed.skipped
    return True
