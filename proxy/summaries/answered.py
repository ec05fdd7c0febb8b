"""The tenants the upstream has answered: whose work a keyless summarizer is spent on ahead.

A summary prepared ahead is work no client waits for, paid by nobody's credential when the
summarizer is keyless (a local model the operator runs): its capacity is the operator's, shared
by every tenant. A tenant is only the hash of whatever key a client sends, and the proxy cannot
check a key before the upstream answers, so 300 made-up keys would be 300 tenants taking turns
in the queue (``prepare_queue.py``) ahead of a real one. The rule: a keyless summarizer prepares
only for a tenant whose requests the upstream has answered with a success in this process. A
key the upstream refuses never gets there; a key it accepts is a client the upstream serves (and
bills), which takes its turn like any other.

A compaction point itself is not held to this: a point is the client's own request, it calls
the summarizer (or takes a prepared summary) as before.

Per process, bounded (the most recent ``capacity`` tenants): a replica that has not yet seen a
tenant answered prepares nothing for it until it has, one request later under round robin.
"""

from __future__ import annotations

from collections import OrderedDict

from proxy.telemetry.exchange import Exchange


class AnsweredTenants:
    """Tenants with a 2xx answer from the upstream in this process (an observer)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()

    def observe(self, exchange: Exchange) -> None:
        if 200 <= exchange.status < 300 and exchange.tenant and exchange.upstream_seconds > 0:
            self.add(exchange.tenant)

    def add(self, tenant: str) -> None:
        self._seen[tenant] = None
        self._seen.move_to_end(tenant)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def __contains__(self, tenant: object) -> bool:
        return tenant in self._seen
