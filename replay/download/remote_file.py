"""A remote parquet file read through HTTP range requests, so that pyarrow fetches the footer
and then only the row groups a download needs, never the whole file."""

from __future__ import annotations

import io
from typing import Any

from replay.download.errors import DownloadError
from replay.download.retrying_http import RetryingHttp

TAIL_BYTES = 64 * 1024


class RemoteFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests.

    The first request fetches the last ``TAIL_BYTES`` (where parquet keeps its footer) and
    learns the size from ``Content-Range``; later reads fetch exactly the bytes asked for.
    A server that ignores ``Range`` sends the whole file once, which is then read from memory.
    """

    def __init__(self, http: RetryingHttp, url: str) -> None:
        super().__init__()
        self._http = http
        self._url = url
        self._pos = 0
        response = http.get(url, headers={"Range": f"bytes=-{TAIL_BYTES}"})
        self._tail = response.content
        if response.status_code == 206:
            start, total = _content_range(response.headers.get("content-range"), url)
            self._tail_start = start
            self.size = total
        else:
            self._tail_start = 0
            self.size = len(self._tail)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = offset
        elif whence == io.SEEK_CUR:
            self._pos += offset
        elif whence == io.SEEK_END:
            self._pos = self.size + offset
        else:
            raise ValueError(f"bad whence {whence}")
        if self._pos < 0:
            raise ValueError("negative seek position")
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self._pos + len(view), self.size)
        if end <= self._pos:
            return 0
        if self._pos >= self._tail_start:
            data = self._tail[self._pos - self._tail_start : end - self._tail_start]
        else:
            response = self._http.get(self._url, headers={"Range": f"bytes={self._pos}-{end - 1}"})
            if response.status_code == 206:
                data = response.content
            else:  # the whole file came back; keep it
                self._tail, self._tail_start = response.content, 0
                data = self._tail[self._pos : end]
            if len(data) != end - self._pos:
                raise DownloadError(f"short read from {self._url}: {len(data)} of {end - self._pos} bytes")
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)


def _content_range(value: str | None, url: str) -> tuple[int, int]:
    """``bytes START-END/TOTAL`` -> (START, TOTAL)."""
    unit, _, rest = (value or "").partition(" ")
    span, _, total = rest.partition("/")
    start = span.partition("-")[0]
    if unit != "bytes" or not start.isdigit() or not total.isdigit():
        raise DownloadError(f"unexpected Content-Range {value!r} from {url}")
    return int(start), int(total)
