"""replay tune's search, on a scripted evaluator: deterministic for a seed, every candidate
measured once, the winner the cheapest feasible one, its snippet a valid policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxy.config.settings import load_settings
from replay.tune.report import write_outputs
from replay.tune.search import (
    Candidate,
    Measured,
    TuneState,
    base_values,
    frontier,
    neighbours,
    sample,
    search,
    searchable,
)

IMPROVED = load_settings(env={}).policies["improved"].stages


def figures(cost: float, survival: float) -> dict[str, Any]:
    kept = round(100 * survival)
    return {
        "reduction": 1 - cost,
        "cost": {"effective_vs_full": cost},
        "survival": {"first_edit": {"visible": kept, "recoverable": 0, "lost": 100 - kept}},
    }


class Scripted:
    """Cheaper with a lower trigger and target; loses evidence when the target is below 0.4."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, batch: list[Candidate]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
        answers = {}
        for candidate in batch:
            self.calls.append(candidate.name)
            knobs = {**base_values(IMPROVED, searchable(IMPROVED)), **dict(candidate.knobs)}
            cost = 0.2 + 0.3 * knobs["trigger.high"] + 0.2 * knobs["summarize.target"]
            survival = 1.0 if knobs["summarize.target"] >= 0.4 else 0.8
            answers[candidate.name] = (figures(cost, survival), {"passed": survival >= 0.95, "failures": []})
        return answers


def test_the_knobs_of_improved_are_searched_with_its_own_values() -> None:
    grid = searchable(IMPROVED)
    assert set(grid) == {
        "trigger.high",
        "summarize.target",
        "summarize.retained_tail",
        "offload.keep_recent",
        "offload.clear_min_chars",
        "offload.min_tokens",
    }
    defaults = base_values(IMPROVED, grid)
    assert defaults["trigger.high"] == 0.75 and defaults["summarize.target"] == 0.5
    assert all(defaults[knob] in grid[knob] for knob in grid)
    assert searchable(load_settings(env={}).policies["n_latest_10"].stages) == {}


def test_sampling_is_deterministic_for_a_seed() -> None:
    grid = searchable(IMPROVED)
    defaults = base_values(IMPROVED, grid)
    first = sample("improved", grid, defaults, 8, seed=7)
    assert first == sample("improved", grid, defaults, 8, seed=7)
    assert first != sample("improved", grid, defaults, 8, seed=8)
    assert len({c.name for c in first}) == 8 and all(c.knobs for c in first)


def test_neighbours_move_one_knob_one_step() -> None:
    grid = searchable(IMPROVED)
    defaults = base_values(IMPROVED, grid)
    moved = neighbours(Candidate("improved", ()), grid, defaults)
    assert all(len(c.knobs) == 1 for c in moved)
    assert Candidate("improved", (("trigger.high", 0.7),)) in moved
    assert Candidate("improved", (("trigger.high", 0.8),)) in moved


def test_search_finds_the_cheapest_feasible_candidate_and_measures_each_once() -> None:
    evaluate = Scripted()
    state = search("improved", IMPROVED, evaluate, trials=10, rounds=4, seed=1)
    assert len(evaluate.calls) == len(set(evaluate.calls)) == len(state.measured)
    feasible = [m for m in state.measured.values() if m.feasible]
    winner = min(feasible, key=lambda m: m.effective)
    knobs = {**base_values(IMPROVED, searchable(IMPROVED)), **dict(winner.candidate.knobs)}
    assert knobs["summarize.target"] >= 0.4
    assert winner.effective < state.measured["improved"].effective
    # The same seed gives the same search; a resumed search measures nothing again.
    again = Scripted()
    assert set(search("improved", IMPROVED, again, trials=10, rounds=4, seed=1).measured) == set(
        state.measured
    )
    resumed = Scripted()
    search("improved", IMPROVED, resumed, trials=10, rounds=4, seed=1, state=state)
    assert resumed.calls == []


def test_the_frontier_holds_no_dominated_candidate() -> None:
    def measured(name: str, cost: float, survival: float) -> Measured:
        return Measured(
            Candidate("improved", (("trigger.high", cost),)), figures(cost, survival), {"passed": True}
        )

    a, b, c = measured("a", 0.4, 0.99), measured("b", 0.5, 1.0), measured("c", 0.6, 0.98)
    assert [m.effective for m in frontier([a, b, c])] == [0.4, 0.5]


def test_outputs_and_the_winner_snippet_is_a_valid_policy(tmp_path: Path) -> None:
    state: TuneState = search("improved", IMPROVED, Scripted(), trials=6, rounds=1, seed=3)
    winner = write_outputs(tmp_path, state, "improved")
    assert winner is not None
    for name in ("tune.json", "tune.md", "frontier.svg", "winner.yml"):
        assert (tmp_path / name).exists(), name
    assert "<script" not in (tmp_path / "frontier.svg").read_text()
    assert "**winner**" in (tmp_path / "tune.md").read_text()
    settings = load_settings(tmp_path / "winner.yml", env={})
    tuned = settings.policies["tuned"]
    assert [next(iter(s)) for s in tuned.stages] == [next(iter(s)) for s in IMPROVED]
