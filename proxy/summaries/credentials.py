"""Which credential pays for a client's summary: the one its own request uses upstream.

The rule (docs/operations/threat-model.md): a credential goes only to the provider its client
addressed, and is spent only on that client's own work. The summarizer (and a summary prepared
ahead for the client) therefore uses exactly the credential the upstream gets for that client:

- the client presented one (``Authorization``, ``api-key``, ``x-api-key``,
  ``x-goog-api-key``): its own headers, as it sent them, to a summarizer at the very provider
  it addressed (scheme, host and port).
  Anywhere else its key may not go, and no operator key is put in its place: a summarizer with
  a key configured (``summarizer.api_key``, or the upstream's key on the upstream's host) is not
  asked at all (the ledger stands in, the reason recorded); a keyless one (a local model) is
  asked without any credential. A client whose key the upstream refuses thus never gets a
  summary the operator paid for: the summarizer refuses its key too.
- the client presented none, and the operator configured a key for the provider it addressed
  (``upstream.api_key`` or ``anthropic.api_key``): the upstream gets the operator's key, so the
  operator's summarizer key pays: ``summarizer.api_key``, else the addressed provider's key
  when the summarizer is at that provider (the very header the upstream gets), else the
  upstream's key on the upstream's host.
- the client presented none and no key is configured for that provider: the upstream gets no
  credential, and neither does the summarizer (a keyless one is asked; one with a key
  configured is not).

``summarizer.api_key`` is the operator's key like any other: it is spent only for clients the
operator already pays for upstream, never for a client that brings its own key (which the
proxy cannot check before the upstream answers), unless the operator says every client is its
own (``summarizer.api_key_pays_for: every_client``: a replay, one team behind its own proxy).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.state.sessions import credentials

Pair = tuple[bytes, bytes]
# A provider's scheme, host and port.
Origin = tuple[str, str, int]

# The reason recorded in the event when no credential may pay (never names a key).
NO_CREDENTIAL = (
    "summarizer not asked: the client's credential is for another provider, "
    "and the operator's key pays only for clients that send none"
)


@dataclass(frozen=True, slots=True)
class SummaryCredential:
    """What the summarizer sends for one client's work. ``headers`` empty: a keyless call;
    ``refused``: no credential may pay, the summarizer is not asked (the reason, public)."""

    # Never in a repr, a log line or an event.
    headers: tuple[Pair, ...] = field(default=(), repr=False)
    refused: str | None = None

    @property
    def payer(self) -> str:
        """Which credential paid, as a digest (never the key): a summary prepared with one
        is served only to a request whose summary that same credential would pay for."""
        if self.refused is not None:
            return "refused"
        digest = hashlib.blake2b(digest_size=12, person=b"cpx-summ-payer")
        for name, value in sorted(self.headers):
            digest.update(name + b"\x1f" + value + b"\x1e")
        return "p_" + digest.hexdigest()


def bearer(key: str) -> SummaryCredential:
    return SummaryCredential(((b"authorization", b"Bearer " + key.encode("latin-1")),))


def summary_credential(
    client_headers: Sequence[Pair],
    *,
    client_origin: Origin | None,
    fallback: Pair | None,
    summarizer_origin: Origin,
    summarizer_key: str | None,
    operator_key: str | None,
    every_client: bool = False,
) -> SummaryCredential:
    """The credential for a summary of this client's work (the rule above).

    ``client_origin``: the provider the client addressed; ``fallback``: the header that provider
    gets for clients that send no credential (the operator's key), if configured;
    ``summarizer_key``: ``summarizer.api_key``; ``operator_key``: the key the summarizer
    would otherwise use (that one, or the upstream's key on the upstream's host)."""
    if summarizer_key and every_client:
        # The operator said every client is its own (``api_key_pays_for: every_client``).
        return bearer(summarizer_key)
    at_provider = client_origin is not None and client_origin == summarizer_origin
    presented = credentials(client_headers)
    if presented:
        if at_provider:
            return SummaryCredential(tuple(presented))
        return SummaryCredential(refused=NO_CREDENTIAL) if operator_key else SummaryCredential()
    if fallback is None:
        # The upstream gets no credential for this client: no operator key pays for it either.
        return SummaryCredential(refused=NO_CREDENTIAL) if operator_key else SummaryCredential()
    if summarizer_key:
        return bearer(summarizer_key)
    if at_provider:
        return SummaryCredential((fallback,))
    return bearer(operator_key) if operator_key else SummaryCredential()
