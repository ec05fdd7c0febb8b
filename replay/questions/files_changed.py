"""``files_changed``: the repository-relative paths the final patch changes.

Evidence is each changed path the history names (the task, a listing, an edit's arguments):
a path the agent never saw is in the reference but cannot be asked of a compacted view.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from replay.questions.question import Question
from replay.questions.recording import locate_path, repo_root
from replay.recording.cases import Case

_DIFF_GIT = re.compile(r'^diff --git ("?a/.+?"?) ("?b/.+?"?)\s*$', re.MULTILINE)
_DIFF_FILE = re.compile(r"^(?:---|\+\+\+) (\S+)", re.MULTILINE)
_RENAME = re.compile(r"^rename (?:from|to) (.+)$", re.MULTILINE)


def _patch_path(raw: str) -> str | None:
    raw = raw.strip().strip('"')
    if raw == "/dev/null":
        return None
    if raw.startswith(("a/", "b/")):
        raw = raw[2:]
    return raw or None


def patch_paths(patch: str) -> list[str]:
    """Repository-relative paths a unified diff changes, in order (renames: both names)."""
    paths: list[str] = []
    for match in _DIFF_GIT.finditer(patch):
        paths.extend(p for p in (_patch_path(match.group(1)), _patch_path(match.group(2))) if p)
    paths.extend(m.strip() for m in _RENAME.findall(patch))
    if not paths:
        paths.extend(p for p in (_patch_path(m) for m in _DIFF_FILE.findall(patch)) if p)
    return list(dict.fromkeys(paths))


def files_changed_question(case: Case, texts: Sequence[tuple[int, str, str]]) -> Question | str:
    """The question, or why it is omitted."""
    patch = case.model_patch
    if not patch or not patch.strip():
        return "no final patch"
    paths = patch_paths(patch)
    if not paths:
        return "final patch changes no file"
    root = repo_root(case)
    evidence: list[str] = []
    where: list[str] = []
    sources: list[int] = []
    for path in paths:
        found = locate_path(texts, path, root)
        if found:
            evidence.append(path)
            sources.append(found[0])
            where.append(found[1])
    if not evidence:
        return "no changed path appears in the history"
    return Question(
        question_id=f"{case.case_id}:files_changed",
        kind="files_changed",
        prompt=(
            "Which files does your final change modify? List every file your final patch changes "
            "(added, modified, renamed or deleted), one repository-relative path per line, and nothing else."
        ),
        reference="\n".join(paths),
        evidence=tuple(evidence),
        exact_items=tuple(paths),
        source_messages=tuple(sorted(set(sources))),
        evidence_in=tuple(where),
    )
