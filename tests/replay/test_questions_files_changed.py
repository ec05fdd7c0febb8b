"""``files_changed`` (replay/questions/files_changed.py): the paths the final patch changes, with
as evidence those the history names."""

from __future__ import annotations

from replay.questions import ARGUMENTS, CONTENT, patch_paths
from tests.replay.question_runs import assert_evidence_in_history, call, native_run, omission, question

PATCH = """diff --git a/pkg/mod.py b/pkg/mod.py
index 1..2 100644
--- a/pkg/mod.py
+++ b/pkg/mod.py
@@ -1 +1 @@
-x = 1
+x = 2
diff --git a/old_name.py b/pkg/new_name.py
similarity index 90%
rename from old_name.py
rename to pkg/new_name.py
diff --git a/tests/test_new.py b/tests/test_new.py
new file mode 100644
--- /dev/null
+++ b/tests/test_new.py
@@ -0,0 +1 @@
+def test(): pass
diff --git a/gone.py b/gone.py
deleted file mode 100644
--- a/gone.py
+++ /dev/null
"""


def test_patch_paths_cover_modified_renamed_new_and_deleted_files() -> None:
    assert patch_paths(PATCH) == [
        "pkg/mod.py",
        "old_name.py",
        "pkg/new_name.py",
        "tests/test_new.py",
        "gone.py",
    ]
    # Without git headers, the ---/+++ lines name the files.
    assert patch_paths("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n") == ["x.py"]


def test_files_changed_evidence_only_paths_the_history_shows() -> None:
    case = native_run(
        (call("", "str_replace_editor", command="view", path="/workspace/proj/pkg/mod.py"), "x = 1"),
        (call("", "execute_bash", command="git mv old_name.py pkg/new_name.py && rm gone.py"), ""),
        patch=PATCH,
    )
    built = question(case, "files_changed")
    assert built.reference.splitlines() == patch_paths(PATCH)
    assert built.exact_items == tuple(patch_paths(PATCH))
    # tests/test_new.py never appears in the history; "pkg/mod.py" appears in the task first.
    assert built.evidence == ("pkg/mod.py", "old_name.py", "pkg/new_name.py", "gone.py")
    assert built.evidence_in == (CONTENT, ARGUMENTS, ARGUMENTS, ARGUMENTS)
    assert built.source_messages == (1, 4)
    assert_evidence_in_history(case, built)


def test_files_changed_omitted_without_patch_or_visible_path() -> None:
    run = (call("", "execute_bash", command="ls"), "setup.py")
    assert omission(native_run(run), "files_changed") == "no final patch"
    assert omission(native_run(run, patch="  \n"), "files_changed") == "no final patch"
    assert omission(native_run(run, patch="not a diff"), "files_changed") == "final patch changes no file"
    other = "diff --git a/elsewhere/z.py b/elsewhere/z.py\n--- a/elsewhere/z.py\n+++ b/elsewhere/z.py\n"
    assert omission(native_run(run, patch=other), "files_changed") == "no changed path appears in the history"


def test_files_changed_path_must_not_be_part_of_a_longer_name() -> None:
    patch = "diff --git a/mod.py b/mod.py\n--- a/mod.py\n+++ b/mod.py\n"
    case = native_run((call("", "execute_bash", command="cat pkg/other_mod.py"), "print(1)"), patch=patch)
    assert omission(case, "files_changed") == "no changed path appears in the history"
