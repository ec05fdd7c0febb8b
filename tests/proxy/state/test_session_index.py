"""Sessions follow the conversation: parallel runs of one task under one key are apart, a
retried request continues its session, an edited history forks, and memory is bounded."""

from __future__ import annotations

from proxy.state.session_index import MAX_BRANCHES, MAX_MARKS, Branch, BranchIndex, PrefixDigests, resolve


def run(marker: str, steps: int) -> list[list[str]]:
    """The message digests of each request of one run: system, task, then its own steps."""
    messages = ["system", "task"]
    requests = [list(messages)]
    for step in range(steps):
        messages = [*messages, f"{marker}-call-{step}", f"{marker}-result-{step}"]
        requests.append(list(messages))
    return requests


def test_one_run_stays_in_its_first_session() -> None:
    index = BranchIndex()
    sessions = {index.resolve("root", "s_root", request).session for request in run("a", 10)}
    assert sessions == {"s_root"}


def test_parallel_runs_of_one_task_are_apart_however_they_interleave() -> None:
    index = BranchIndex()
    runs = [run(f"r{i}", 12) for i in range(8)]
    seen: dict[int, set[str]] = {i: set() for i in range(8)}
    for step in range(13):
        for i, requests in enumerate(runs):
            resolution = index.resolve("root", "s_root", requests[step])
            if step > 0:
                seen[i].add(resolution.session)
    # After the shared first request, each run has exactly one session of its own.
    assert all(len(sessions) == 1 for sessions in seen.values())
    assert len(set().union(*seen.values())) == 8


def test_a_late_starter_forks_and_knows_what_it_shares() -> None:
    index = BranchIndex()
    first = run("a", 6)
    for request in first:
        index.resolve("root", "s_root", request)
    second = run("b", 2)
    fork = index.resolve("root", "s_root", second[1])
    assert fork.kind == "fork" and fork.parent == "s_root" and fork.common == 2
    assert index.resolve("root", "s_root", second[2]).session == fork.session
    # The first run goes on in its own session.
    assert index.resolve("root", "s_root", [*first[-1], "a-call-6", "a-result-6"]).session == "s_root"


def test_a_retried_request_continues_the_same_session() -> None:
    index = BranchIndex()
    requests = run("a", 3)
    for request in requests:
        index.resolve("root", "s_root", request)
    again = index.resolve("root", "s_root", requests[-1])
    assert again.kind == "continue" and again.session == "s_root"


def test_an_edited_history_forks_from_the_longest_shared_request() -> None:
    index = BranchIndex()
    requests = run("a", 5)
    for request in requests:
        index.resolve("root", "s_root", request)
    edited = [*requests[3][:-1], "a-result-2-EDITED"]
    fork = index.resolve("root", "s_root", edited)
    assert fork.kind == "fork" and fork.common == len(requests[2])


def test_memory_is_bounded() -> None:
    index = BranchIndex(max_roots=3)
    for root in range(10):
        index.resolve(f"root{root}", f"s_{root}", ["system", "task"])
    assert len(index._roots) == 3
    branches: list[Branch] = []
    for i in range(40):
        resolve(branches, "s_root", PrefixDigests(["system", "task", f"x{i}"]))
    assert len(branches) == MAX_BRANCHES
    long_run = run("a", 100)
    branches = []
    for request in long_run:
        resolve(branches, "s_root", PrefixDigests(request))
    assert len(branches) == 1 and len(branches[0].marks) == MAX_MARKS
