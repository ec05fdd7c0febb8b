"""Which model names the configured upstreams usually serve that the ``models`` table does not
cover. Such a model gets the default window, which may be far from its real one (a 200k
model compacted as if it had 128k, or an 8k local model not compacted until its upstream
refuses the request), so ``check-config`` names them before any traffic does."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from policies.windows import ContextWindows

# The names agents send most to each provider's own API (a sample to check the table
# against, not a list of what the proxy accepts: any name is forwarded).
USUAL_MODELS: dict[str, tuple[str, ...]] = {
    "api.openai.com": (
        "gpt-4o",
        "gpt-4o-mini",
        "gpt-4.1",
        "gpt-4.1-mini",
        "gpt-5",
        "gpt-5-mini",
        "gpt-5-codex",
        "o3",
        "o4-mini",
        "codex-mini-latest",
    ),
    "api.anthropic.com": (
        "claude-sonnet-4-5",
        "claude-opus-4-1",
        "claude-haiku-4-5",
        "claude-3-7-sonnet-latest",
    ),
    "generativelanguage.googleapis.com": (
        "gemini-2.5-pro",
        "gemini-2.5-flash",
        "gemini-2.5-flash-lite",
        "gemini-3-pro-preview",
        "gemini-3-flash-preview",
    ),
    "cloudcode-pa.googleapis.com": ("gemini-2.5-pro", "gemini-2.5-flash", "gemini-3-pro-preview"),
}


def coverage(windows: Mapping[str, int], base_urls: list[str]) -> list[tuple[str, list[str] | None]]:
    """Per configured upstream host: its usual names the table leaves to the default window,
    or None when its names are not known here (a local or third-party server)."""
    table = ContextWindows(windows)
    found: list[tuple[str, list[str] | None]] = []
    for base_url in dict.fromkeys(base_urls):
        host = urlsplit(base_url).hostname or base_url
        usual = USUAL_MODELS.get(host)
        found.append((host, None if usual is None else [name for name in usual if not table.covers(name)]))
    return found


def uncovered_models(windows: Mapping[str, int], base_urls: list[str], learning: bool = False) -> list[str]:
    """Lines for ``check-config``: per upstream, its usual names that fall to the default
    window, or that its names are unknown here (a local or third-party server)."""
    default = windows.get("default", 128_000)
    lines: list[str] = []
    for host, missing in coverage(windows, base_urls):
        if missing is None and learning:
            lines.append(
                f"{host}: its model names are not known here; each one's window is asked from it once "
                "(or learned from its first context-length error) unless `models:` sets it"
            )
        elif missing is None:
            lines.append(
                f"{host}: its model names are not known here; add each model your agents use "
                f"to `models:` (unmatched names get the default window, {default})"
            )
        elif missing:
            lines.append(
                f"{host}: not covered, so given the default window ({default}): {', '.join(missing)}"
            )
        else:
            lines.append(f"{host}: every usual model name has a pattern")
    return lines
