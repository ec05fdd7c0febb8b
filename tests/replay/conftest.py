"""Fixtures of the ``replay.download`` tests: the dataset's parquet files, and the fake Hub
serving them (``fake_hub.py``). pyarrow is imported by the fixtures that need it, so that the
other replay tests run without it."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
import respx

from replay.recording.rows import iter_rows
from tests.replay.fake_hub import FIXTURES, ROWS_IN_FIRST_FILE, FakeHub

# The question tests' shared checks assert inside this helper module: rewritten, their failures
# show the values compared, as they did when the checks sat in the test module.
pytest.register_assert_rewrite("tests.replay.question_runs")


@pytest.fixture(scope="module")
def fixture_rows() -> list[dict[str, Any]]:
    return list(iter_rows(FIXTURES / "rows.jsonl"))


@pytest.fixture(scope="module")
def blobs(fixture_rows: list[dict[str, Any]]) -> list[bytes]:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.Table.from_pylist(fixture_rows)
    parts = [table.slice(0, ROWS_IN_FIRST_FILE), table.slice(ROWS_IN_FIRST_FILE)]
    out = []
    for part in parts:
        buffer = io.BytesIO()
        pq.write_table(part, buffer, row_group_size=2)
        out.append(buffer.getvalue())
    return out


@pytest.fixture(scope="module")
def dataset_rows(blobs: list[bytes]) -> list[dict[str, Any]]:
    """The rows exactly as the parquet files deliver them (what the download must write)."""
    pq = pytest.importorskip("pyarrow.parquet")
    rows: list[dict[str, Any]] = []
    for blob in blobs:
        rows.extend(pq.read_table(io.BytesIO(blob)).to_pylist())
    return rows


@pytest.fixture
def hub(blobs: list[bytes]) -> Iterator[FakeHub]:
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as router:
        yield FakeHub(router, blobs)
