"""The one error every step of a download raises (its own module: every step imports it)."""

from __future__ import annotations


class DownloadError(Exception):
    """A failure with a message meant for the user (no traceback needed)."""
