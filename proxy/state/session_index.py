"""Sessions that follow the conversation: which session a request without ``X-Session-Id``
belongs to.

Requests of one agent run extend each other: each one's messages start with what the
previous request sent, then add the new steps. Several runs of one task under one key (pass@k,
A/A' repeats, a fleet of agents) share their system prompt and task, so those alone cannot tell
the runs apart. The index keeps, per *root* (tenant, policy, system prompt and first user
message), a few **branches**, each a session with the fingerprints of its recent requests: the
number of messages and a digest of them. A request

- **continues** the branch whose latest request it extends (the longest such), as a retried
  request (the same body twice) does;
- else **forks** from the branch with an earlier request it extends (a second run of the
  task, or an agent that edited or truncated its history): a new session, which may start
  from the parent's checkpoint when everything that checkpoint decided lies in the messages
  they share;
- else starts a new branch.

The first branch of a root is named as sessions always were (a hash of the tenant, the system
prompt and the first user message), so a single run keeps its session id. Fingerprints are
digests of the per-message digests (memoized per text), so a request costs one memo lookup per
message and one hash per branch it is checked against. Memory is bounded: ``max_roots`` roots,
``MAX_BRANCHES`` branches per root and ``MAX_MARKS`` requests per branch, least recently used
first out. ``BranchIndex`` keeps them in memory for one process; replicas on one store share
them through the store (``Store.resolve_branch``), with the same pure ``resolve`` below.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

MAX_BRANCHES = 16
MAX_MARKS = 32


class Branch(msgspec.Struct):
    """One session of a root and the (message count, prefix digest) of its recent requests,
    oldest first; the last is its latest request."""

    session: str
    marks: list[tuple[int, str]] = msgspec.field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Resolution:
    session: str
    # A fork: the session whose earlier request this one extends, and how many messages they share.
    parent: str | None = None
    common: int = 0
    kind: str = "continue"  # continue, fork, new


@dataclass
class PrefixDigests:
    """Digests of a request's message prefixes, computed on demand from per-message digests."""

    digests: Sequence[str]
    _cache: dict[int, str] = field(default_factory=dict)

    def __call__(self, count: int) -> str:
        found = self._cache.get(count)
        if found is None:
            found = hashlib.blake2b("".join(self.digests[:count]).encode(), digest_size=12).hexdigest()
            self._cache[count] = found
        return found


def fork_name(root_session: str, prefix: str) -> str:
    return "s_" + hashlib.blake2b(f"{root_session}\x1f{prefix}".encode(), digest_size=12).hexdigest()


def resolve(branches: list[Branch], root_session: str, prefixes: PrefixDigests) -> Resolution:
    """Choose the session of a request among ``branches`` (most recently used first) and
    record the request in it; ``branches`` is updated in place."""
    count = len(prefixes.digests)
    best: Branch | None = None
    for branch in branches:
        latest, digest = branch.marks[-1]
        if latest <= count and (best is None or latest > best.marks[-1][0]) and prefixes(latest) == digest:
            best = branch
    if best is not None:
        if best.marks[-1][0] != count:
            best.marks.append((count, prefixes(count)))
            del best.marks[:-MAX_MARKS]
        branches.remove(best)
        branches.insert(0, best)
        return Resolution(best.session)
    parent: Branch | None = None
    common = 0
    for branch in branches:
        for marked, digest in reversed(branch.marks[:-1]):
            if marked <= count and marked > common and prefixes(marked) == digest:
                parent, common = branch, marked
                break
    session = fork_name(root_session, prefixes(count)) if branches else root_session
    branches.insert(0, Branch(session, [(count, prefixes(count))]))
    del branches[MAX_BRANCHES:]
    if parent is None:
        return Resolution(session, kind="new")
    return Resolution(session, parent=parent.session, common=common, kind="fork")


class BranchIndex:
    """The branches of every root, in this process's memory (least recently used roots out)."""

    def __init__(self, max_roots: int = 10_000) -> None:
        self.max_roots = max_roots
        self._roots: OrderedDict[str, list[Branch]] = OrderedDict()

    def resolve(self, root_key: str, root_session: str, digests: Sequence[str]) -> Resolution:
        branches = self._roots.get(root_key)
        if branches is None:
            branches = self._roots[root_key] = []
            while len(self._roots) > self.max_roots:
                self._roots.popitem(last=False)
        else:
            self._roots.move_to_end(root_key)
        return resolve(branches, root_session, PrefixDigests(digests))


_branches_encoder = msgspec.json.Encoder()
_branches_decoder = msgspec.json.Decoder(list[Branch])


def encode_branches(branches: list[Branch]) -> bytes:
    return _branches_encoder.encode(branches)


def decode_branches(data: bytes | None) -> list[Branch]:
    if not data:
        return []
    try:
        return _branches_decoder.decode(data)
    except msgspec.DecodeError:
        return []
