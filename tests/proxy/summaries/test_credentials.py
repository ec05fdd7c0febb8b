"""Which credential pays for a client's summary: the one its own request uses upstream. The
client's key when it sent one (only at the provider it addressed), the operator's key only for
a client that sends none where the operator's key is what that provider gets; never the
operator's key in place of a client's."""

from __future__ import annotations

from typing import Any

import pytest

from policies.ledger_extraction import build_ledger
from policies.summarizer import SummaryRequest, SummaryResult
from proxy.config.settings import SummarizerSettings
from proxy.summaries.credentials import NO_CREDENTIAL, SummaryCredential, bearer, summary_credential
from proxy.summaries.prepared import NeverWaiting, PreparedSummaries
from proxy.summaries.summarizer import OpenAISummarizer, SummarizerError

OPENAI = ("https", "api.openai.com", 443)
ANTHROPIC = ("https", "api.anthropic.com", 443)
OPERATOR = "sk-operator-000"
OPERATOR_FALLBACK = (b"authorization", b"Bearer " + OPERATOR.encode())
ANT_FALLBACK = (b"x-api-key", b"sk-ant-operator")
CLIENT = [(b"authorization", b"Bearer sk-client-111")]
ANT_CLIENT = [(b"x-api-key", b"sk-ant-client"), (b"anthropic-version", b"2023-06-01")]


def decide(
    headers: list[tuple[bytes, bytes]],
    origin: tuple[str, str, int],
    fallback: tuple[bytes, bytes] | None,
    *,
    at: tuple[str, str, int] = OPENAI,
    summarizer_key: str | None = None,
    operator_key: str | None = OPERATOR,
) -> SummaryCredential:
    return summary_credential(
        headers,
        client_origin=origin,
        fallback=fallback,
        summarizer_origin=at,
        summarizer_key=summarizer_key,
        operator_key=operator_key,
    )


def test_a_clients_own_key_pays_at_its_provider_never_the_operators() -> None:
    assert decide(CLIENT, OPENAI, OPERATOR_FALLBACK).headers == tuple(CLIENT)
    # An explicit summarizer key on the client's provider does not stand in for its key either.
    assert decide(CLIENT, OPENAI, OPERATOR_FALLBACK, summarizer_key="sk-summ").headers == tuple(CLIENT)
    # Azure's api-key and Anthropic's x-api-key go as the client sent them.
    azure = [(b"api-key", b"azure-client")]
    assert decide(azure, OPENAI, OPERATOR_FALLBACK).headers == tuple(azure)
    ant = decide(ANT_CLIENT, ANTHROPIC, ANT_FALLBACK, at=ANTHROPIC)
    assert ant.headers == ((b"x-api-key", b"sk-ant-client"),)


def test_a_clients_key_elsewhere_is_neither_sent_nor_replaced_by_the_operators() -> None:
    # An Anthropic client, a summarizer on the OpenAI host holding the operator's key: not asked.
    refused = decide(ANT_CLIENT, ANTHROPIC, ANT_FALLBACK)
    assert refused.refused == NO_CREDENTIAL and refused.headers == ()
    # Its explicit summarizer.api_key on another host: the operator's key, not spent on it.
    other = ("https", "summarizer.example", 443)
    assert decide(CLIENT, OPENAI, OPERATOR_FALLBACK, at=other, summarizer_key="sk-summ").refused
    # A keyless summarizer elsewhere (a local model): asked without any credential.
    keyless = decide(CLIENT, OPENAI, OPERATOR_FALLBACK, at=other, operator_key=None)
    assert keyless.refused is None and keyless.headers == ()


def test_the_operators_key_pays_only_where_it_is_what_the_upstream_gets() -> None:
    # No credential, the provider gets the operator's key: the summarizer gets that same header.
    assert decide([], OPENAI, OPERATOR_FALLBACK).headers == (OPERATOR_FALLBACK,)
    # ... or the operator's summarizer key, when one is configured.
    assert decide([], OPENAI, OPERATOR_FALLBACK, summarizer_key="sk-summ") == bearer("sk-summ")
    # An anonymous Anthropic client the operator pays for: the operator's key on the summarizer.
    assert decide([], ANTHROPIC, ANT_FALLBACK) == bearer(OPERATOR)
    assert decide([], ANTHROPIC, ANT_FALLBACK, at=ANTHROPIC).headers == (ANT_FALLBACK,)
    # No key configured for the provider it addressed: the operator's key pays nothing for it.
    assert decide([], ANTHROPIC, None).refused == NO_CREDENTIAL
    assert decide([], OPENAI, None, operator_key=None) == SummaryCredential()


def test_payers_differ_by_credential_and_never_show_a_key() -> None:
    one, other = decide(CLIENT, OPENAI, OPERATOR_FALLBACK), decide([], OPENAI, OPERATOR_FALLBACK)
    assert one.payer != other.payer and one.payer == decide(CLIENT, OPENAI, None).payer
    for credential in (one, other):
        assert "sk-" not in credential.payer and "sk-" not in repr(credential)


async def test_a_refused_credential_never_reaches_the_model() -> None:
    summarizer = OpenAISummarizer(
        SummarizerSettings(kind="openai", model="small"), base_url="http://127.0.0.1:9/v1", api_key=OPERATOR
    )
    session = summarizer.for_session("s", SummaryCredential(refused=NO_CREDENTIAL))
    assert not session.payable
    with pytest.raises(SummarizerError, match="not asked"):
        await session.summarize(_request())
    assert summarizer.calls == 0
    await summarizer.aclose()


class _Paid:
    """A model summarizer paid with a given credential."""

    def __init__(self, payer: str) -> None:
        self.payer = payer

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(
            text="The agent ran the checks; all passed.", model="small", prompt_family="hybrid_v2"
        )


def _request() -> SummaryRequest:
    history = [{"role": "user", "content": "Run the checks."}, {"role": "assistant", "content": "Done."}]
    return SummaryRequest(
        previous_summary=None,
        messages=history,
        ledger=build_ledger(history),
        prompt_family="hybrid_v2",
        covered=(0, 2),
        covered_digests=("d0", "d1"),
    )


async def test_a_prepared_summary_is_served_only_under_the_credential_that_paid() -> None:
    summaries = PreparedSummaries(max_tokens=1000, count=len)
    operator, client = bearer(OPERATOR).payer, SummaryCredential(tuple(CLIENT)).payer
    summaries.start("t", "s", _request(), _Paid(operator))
    await summaries.settle("s")
    used = await NeverWaiting(summaries, "t", "s", _Paid(client)).summarize(_request())
    assert used.model == "ledger" and used.prepared == "rejected: prepared with another credential"
    # The same credential is served what it paid for.
    summaries.start("t", "s", _request(), _Paid(client))
    await summaries.settle("s")
    used = await NeverWaiting(summaries, "t", "s", _Paid(client)).summarize(_request())
    assert used.prepared == "used" and used.model == "small"


def test_the_summarizer_key_pays_for_every_client_only_when_the_operator_says_so() -> None:
    arguments: dict[str, Any] = {
        "client_origin": ("https", "api.openai.com", 443),
        "fallback": None,
        "summarizer_origin": ("http", "127.0.0.1", 8080),
        "summarizer_key": "sk-summarizer",
        "operator_key": "sk-summarizer",
    }
    own_key = [(b"authorization", b"Bearer sk-client")]
    assert summary_credential(own_key, **arguments).refused is not None
    paid = summary_credential(own_key, **arguments, every_client=True)
    assert paid.payer == bearer("sk-summarizer").payer
