"""The caches of token counts ``policies.tokens`` keeps: by text per encoding (with the cheap
dictionary key it, and ``policies.digests``, file long texts under), and by object for the
tool schemas a conversation's bodies share."""

from __future__ import annotations


def text_key(text: str) -> object:
    """A cheap dictionary key for a text: long texts are keyed by length and both ends,
    which costs a fixed ~100-character hash instead of hashing the whole text. The caller
    keeps the full text with the value and compares it on a hit, so lookups stay exact."""
    return text if len(text) <= 128 else (len(text), text[:48], text[-48:])


class TextCountCache:
    """Two-generation cache of ``text -> token count``, bounded by the characters it holds.

    A hit is exact: the stored text is compared with the asked one (a memcmp, far cheaper
    than hashing it). When the young generation fills half the budget it becomes the old
    one; a hit in the old generation is promoted. That approximates LRU in O(1).
    """

    def __init__(self, max_chars: int) -> None:
        self._half = max(1, max_chars // 2)
        self._young: dict[object, tuple[str, int]] = {}
        self._old: dict[object, tuple[str, int]] = {}
        self._young_chars = 0
        self.flips = 0

    def _find(self, text: str) -> tuple[bool, tuple[str, int]] | None:
        """(found in the old generation, the entry) for ``text``."""
        key = text_key(text)
        for generation in (self._young, self._old):
            entry = generation.get(key)
            if entry is not None and entry[0] != text:
                # Same length and ends, other middle: such texts live under their full text.
                entry = generation.get(text)
            if entry is not None and entry[0] == text:
                return generation is self._old, entry
        return None

    def get(self, text: str) -> int | None:
        found = self._find(text)
        if found is None:
            return None
        old, entry = found
        if old:
            # Promoted as the stored object, not the asker's equal copy: a text the digests
            # memo also holds then stays one object in memory.
            self.put(entry[0], entry[1])
        return entry[1]

    def stored(self, text: str) -> str | None:
        """The cache's own object equal to ``text``, if it holds one."""
        found = self._find(text)
        if found is not None:
            return found[1][0]
        return None

    def put(self, text: str, count: int) -> None:
        if len(text) > self._half:
            return
        key = text_key(text)
        taken = self._young.get(key)
        self._young[key if taken is None or taken[0] == text else text] = (text, count)
        self._young_chars += len(text)
        if self._young_chars > self._half:
            self._old = self._young
            self._young = {}
            self._young_chars = 0
            self.flips += 1

    def __len__(self) -> int:
        return len(self._young) + len(self._old)


class ObjectCounts:
    """Token counts of objects by identity (tool schemas a conversation's bodies share), in two
    generations of at most ``max_objects`` each. An entry holds its object, so its id cannot
    name another object while it is remembered; a hit must be the very object. The objects
    must not change once counted (a parsed body is never edited in place). The bound keeps
    what conversations no longer send small: a generation of 4,096 of Claude Code's schemas
    (24 a request) is about 170 conversations' worth, 21 MB, and most of what both generations
    hold is held by the conversations' last bodies anyway."""

    def __init__(self, max_objects: int = 4096) -> None:
        self._max = max(1, max_objects)
        self._young: dict[tuple[str, int], tuple[object, int]] = {}
        self._old: dict[tuple[str, int], tuple[object, int]] = {}

    def get(self, encoding: str, value: object) -> int | None:
        key = (encoding, id(value))
        entry = self._young.get(key)
        if entry is not None and entry[0] is value:
            return entry[1]
        entry = self._old.get(key)
        if entry is None or entry[0] is not value:
            return None
        self.put(encoding, value, entry[1])  # still in use: promoted
        return entry[1]

    def put(self, encoding: str, value: object, count: int) -> None:
        if len(self._young) >= self._max:
            self._old, self._young = self._young, {}
        self._young[(encoding, id(value))] = (value, count)
