"""``python -m replay.download``: the same options as ``compaction-proxy replay download``."""

from __future__ import annotations

from replay.download.command import main

raise SystemExit(main())
