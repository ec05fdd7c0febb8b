"""HTTP GETs to the Hub that retry what is worth retrying and turn the rest into one clear
``DownloadError`` line: 429, 5xx and transport errors are retried with exponential backoff,
other 4xx answers fail at once."""

from __future__ import annotations

import email.utils
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx

from replay.download.errors import DownloadError

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries for 429, 5xx and transport errors, with exponential backoff; a
    ``Retry-After`` header is honoured up to ``max_retry_after`` seconds."""

    attempts: int = 5
    base_delay: float = 1.0
    max_delay: float = 30.0
    max_retry_after: float = 300.0
    sleep: Callable[[float], None] = field(default=lambda seconds: time.sleep(seconds))


class RetryingHttp:
    def __init__(self, client: httpx.Client, retry: RetryPolicy, verbose: bool = False) -> None:
        self.client = client
        self.retry = retry
        self.verbose = verbose

    def _wait(self, host: str, problem: str, delay: float, attempt: int) -> None:
        if self.verbose:
            sys.stderr.write(
                f"download: {host}: {problem}; retrying in {delay:.0f} s "
                f"(attempt {attempt + 1}/{self.retry.attempts})\n"
            )
            sys.stderr.flush()
        self.retry.sleep(delay)

    def get(self, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
        host = urlsplit(url).hostname or url
        last_problem = ""
        for attempt in range(1, self.retry.attempts + 1):
            try:
                response = self.client.get(url, headers=headers, follow_redirects=True)
            except httpx.TransportError as exc:
                last_problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if attempt == self.retry.attempts:
                    raise DownloadError(
                        f"{host} unreachable ({last_problem}); check the network and try again"
                    ) from None
                self._wait(host, last_problem, self._backoff(attempt), attempt)
                continue
            if response.status_code in RETRY_STATUSES:
                last_problem = f"HTTP {response.status_code}"
                if attempt == self.retry.attempts:
                    break
                self._wait(host, last_problem, self._retry_delay(response, attempt, host), attempt)
                continue
            if response.status_code >= 400:
                raise DownloadError(f"{host} answered HTTP {response.status_code} for {url}")
            return response
        raise DownloadError(f"{host} kept failing ({last_problem}) after {self.retry.attempts} attempts")

    def _backoff(self, attempt: int) -> float:
        return float(min(self.retry.max_delay, self.retry.base_delay * 2 ** (attempt - 1)))

    def _retry_delay(self, response: httpx.Response, attempt: int, host: str) -> float:
        value = response.headers.get("retry-after")
        if value is None:
            return self._backoff(attempt)
        delay: float | None
        try:
            delay = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
                delay = (when - datetime.now(UTC)).total_seconds()
            except (TypeError, ValueError):
                delay = None
        if delay is None:
            return self._backoff(attempt)
        if delay > self.retry.max_retry_after:
            raise DownloadError(
                f"{host} asks to wait {delay:.0f} s (HTTP {response.status_code}); try again later"
            )
        return max(0.0, delay)
