"""Which rows a download keeps: resolved or not, a token range, one row per repository."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from replay.recording.rows import row_messages, row_tools

# Token estimates use the project's offline counter (policies.tokens) with this encoding,
# over the cleaned messages and tool schemas of a row, as a chat request would carry them.
TOKEN_ENCODING = "o200k_base"  # noqa: S105 (an encoding name)


@dataclass(frozen=True, slots=True)
class DownloadFilters:
    """Which rows to keep. ``resolved=None`` keeps any; token bounds are inclusive."""

    resolved: bool | None = None
    min_tokens: int | None = None
    max_tokens: int | None = None
    one_per_repo: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "min_tokens": self.min_tokens,
            "max_tokens": self.max_tokens,
            "one_per_repo": self.one_per_repo,
            "token_encoding": TOKEN_ENCODING,
        }

    @property
    def counts_tokens(self) -> bool:
        return self.min_tokens is not None or self.max_tokens is not None


class RowMatcher:
    """Applies the filters row by row; ``repos`` are those already taken (for one per repo)."""

    def __init__(self, filters: DownloadFilters, repos_taken: Sequence[str]) -> None:
        self.filters = filters
        self.repos = set(repos_taken)
        self._counter: Any = None

    def tokens(self, row: dict[str, Any]) -> int:
        if self._counter is None:
            # Imported on first use: only the token filters need a counter.
            from policies.tokens import TokenCounter

            self._counter = TokenCounter(default_encoding=TOKEN_ENCODING)
        body = {"messages": row_messages(row), "tools": row_tools(row)}
        return int(self._counter.count_request(body).total)

    def matches(self, row: dict[str, Any]) -> bool:
        f = self.filters
        if f.resolved is not None and row.get("resolved") is not f.resolved:
            return False
        repo = row.get("repo")
        if f.one_per_repo and isinstance(repo, str) and repo in self.repos:
            return False
        if f.counts_tokens:
            tokens = self.tokens(row)
            if f.min_tokens is not None and tokens < f.min_tokens:
                return False
            if f.max_tokens is not None and tokens > f.max_tokens:
                return False
        return True
