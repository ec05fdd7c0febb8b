"""The prompt-cache simulator and the effective cost (``replay.session.cost``,
``replay.report.cost_figures``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from replay.config import ModelPrices, ReplayConfigError, load_replay_config
from replay.report.cost_figures import arm_cost, compare_to_full, cost_model, per_successful_answer
from replay.session.cost import Billed, RequestShape, SessionLog, simulate


def shape(blocks: list[tuple[int, int]], kind: str = "step", **extra: Any) -> RequestShape:
    """A request from (block id, tokens) pairs: block 0 stands for the tool schemas."""
    return RequestShape(kind, tuple(i for i, _ in blocks), tuple(t for _, t in blocks), **extra)


def growing(steps: int, head: int = 1500, step: int = 300) -> list[RequestShape]:
    """An agent's session whose view only grows: tools + system, then one message per step."""
    return [shape([(0, 500), (1, head)] + [(10 + n, step) for n in range(k)]) for k in range(steps)]


def cached(shapes: list[RequestShape], rule: str = "openai", **options: Any) -> list[int]:
    return [b.cached if b is not None else -1 for b in simulate(shapes, rule, **options)]


# --- OpenAI: longest common prefix, 1,024 tokens on, 128-token steps ------------------------


def test_append_only_growth_hits_the_previous_prompt() -> None:
    shapes = growing(4)
    # Request k shares all of request k-1's blocks: 2000 + 300 (k-1) tokens, in 128s.
    assert cached(shapes) == [0, 1920, 2176, 2560]
    billed = simulate(shapes, "openai")
    assert [b.prompt for b in billed if b] == [2000, 2300, 2600, 2900]


def test_a_rewritten_middle_misses_from_the_changed_message_on() -> None:
    before = shape([(0, 500), (1, 1500), (2, 400), (3, 400), (4, 400)])
    # A compaction point: message 3 replaced by a summary (id 9); 2 kept, 4 kept after it.
    after = shape([(0, 500), (1, 1500), (2, 400), (9, 100), (4, 400), (5, 300)])
    assert cached([before, after]) == [0, 2304]  # 500 + 1500 + 400, rounded to 128s
    # A sliding window drops the oldest message: only the tools block still matches.
    slid = shape([(0, 500), (1, 1500), (3, 400), (4, 400), (5, 300)])
    assert cached([before, slid]) == [0, 1920]
    dropped_system = shape([(0, 500), (3, 400), (4, 400), (5, 300)])
    assert cached([before, dropped_system]) == [0, 0]


def test_under_1024_tokens_nothing_is_cached() -> None:
    small = [shape([(0, 100), (1, 500)]), shape([(0, 100), (1, 500), (2, 400)])]
    assert cached(small) == [0, 0]  # a common prefix of 600 tokens
    edge = [shape([(0, 24), (1, 1000)]), shape([(0, 24), (1, 1000), (2, 50)])]
    assert cached(edge) == [0, 1024]


def test_cached_tokens_are_rounded_down_to_128() -> None:
    shapes = [shape([(0, 1151)]), shape([(0, 1151), (1, 10)]), shape([(0, 1151), (1, 10), (2, 1)])]
    assert cached(shapes) == [0, 1024, 1152]  # 1151 -> 1024; 1161 -> 1152


def test_the_horizon_forgets_older_requests() -> None:
    base = shape([(0, 2000), (1, 500)])
    others = [shape([(50 + n, 2000)]) for n in range(3)]
    back = shape([(0, 2000), (1, 500), (2, 100)])
    assert cached([base, *others, back], horizon=4)[-1] == 2432  # base is 4 requests back
    assert cached([base, *others, back], horizon=3)[-1] == 0


def test_question_probes_are_neither_billed_nor_cached() -> None:
    probe = shape([(0, 500), (1, 1500), (99, 5000)], kind="question")
    step = shape([(0, 500), (1, 1500), (99, 5000), (3, 10)])
    billed = simulate([shape([(0, 500), (1, 1500)]), probe, step], "openai")
    assert billed[1] is None
    assert billed[2] == Billed(prompt=7010, cached=1920)  # the probe's prefix was never cached


# --- Anthropic: breakpoints ------------------------------------------------------------------


def test_anthropic_reads_up_to_a_breakpoint_an_earlier_request_wrote() -> None:
    first = shape([(0, 500), (1, 1500), (2, 400)], breakpoints=(1,))
    second = shape([(0, 500), (1, 1500), (2, 400), (3, 400)], breakpoints=(1,))
    billed = simulate([first, second], "anthropic", client_breakpoint=False)
    # The first writes 2,000 tokens at its breakpoint; the second reads them, writes nothing new.
    assert billed == [Billed(2400, 0, 2000), Billed(2800, 2000, 0)]


def test_anthropic_client_breakpoint_caches_the_growing_conversation() -> None:
    shapes = growing(4)
    billed = simulate(shapes, "anthropic", client_breakpoint=True)
    assert [b.cached for b in billed if b] == [0, 2000, 2300, 2600]  # no 128-token rounding
    assert [b.written for b in billed if b] == [2000, 300, 300, 300]
    assert [b.cached for b in simulate(shapes, "anthropic", client_breakpoint=False) if b] == [0] * 4


def test_anthropic_misses_when_the_prefix_before_the_breakpoint_changed() -> None:
    first = shape([(0, 500), (1, 1500), (2, 400)], breakpoints=(2,))
    changed = shape([(0, 500), (7, 1500), (2, 400), (3, 10)], breakpoints=(2,))
    assert cached([first, changed], "anthropic", client_breakpoint=False) == [0, 0]


def test_anthropic_finds_an_entry_within_the_lookback_only() -> None:
    first = shape([(0, 1500), (1, 10)], breakpoints=(1,))
    near = shape([(0, 1500), (1, 10)] + [(10 + n, 10) for n in range(20)], breakpoints=(21,))
    far = shape([(0, 1500), (1, 10)] + [(10 + n, 10) for n in range(21)], breakpoints=(22,))
    assert cached([first, near], "anthropic", client_breakpoint=False)[-1] == 1510
    assert cached([first, far], "anthropic", client_breakpoint=False)[-1] == 0


def test_anthropic_prefixes_under_1024_tokens_are_not_written() -> None:
    small = [shape([(0, 500), (1, 400)]), shape([(0, 500), (1, 400), (2, 10)])]
    assert [b.written for b in simulate(small, "anthropic") if b] == [0, 0]
    assert cached(small, "anthropic") == [0, 0]


def test_no_cache_rule_and_unknown_rules() -> None:
    assert cached(growing(3), "none") == [0, 0, 0]
    with pytest.raises(ValueError, match="unknown cache rule"):
        simulate(growing(2), "azure")


def test_session_log_interns_digests_and_round_trips() -> None:
    log = SessionLog()
    log.add("step", [(b"tools", 50), (b"system", 1200)], extra=3)
    log.add("step", [(b"tools", 50), (b"system", 1200), (b"user", 30)], breakpoints=[2, 1, 2])
    second = log.shapes[1]
    assert second.ids == (0, 1, 2) and second.breakpoints == (1, 2) and second.prompt == 1280
    assert [RequestShape.from_json(s) for s in log.to_json()] == log.shapes


# --- prices and the arm's figures ---------------------------------------------------------------


def test_the_price_table_is_validated(tmp_path: Path) -> None:
    config = load_replay_config(None)
    assert config.prices.models["gpt-5*"] == ModelPrices(cached_input=0.1, output=8.0)
    with pytest.raises(ReplayConfigError, match="cached_input"):
        load_replay_config(None, {"prices": {"openai": {"cached_input": -0.5}}})
    with pytest.raises(ReplayConfigError, match="cached_inptu"):
        load_replay_config(None, {"prices": {"openai": {"cached_inptu": 0.5}}})
    with pytest.raises(ReplayConfigError, match="summarizer_output"):
        load_replay_config(None, {"prices": {"summarizer_output": float("inf")}})
    with pytest.raises(ReplayConfigError, match="horizon"):
        load_replay_config(None, {"cache": {"horizon": 0}})
    with pytest.raises(ReplayConfigError, match="rule"):
        load_replay_config(None, {"cache": {"rule": "azure"}})
    path = tmp_path / "replay.yml"
    path.write_text(yaml.safe_dump({"prices": {"models": {"my-model*": {"cached_input": 0.2}}}}))
    assert load_replay_config(path).prices.models == {"my-model*": ModelPrices(cached_input=0.2)}


def test_rates_come_from_the_first_matching_model_else_the_provider() -> None:
    model = cost_model(load_replay_config(None))
    assert (model.rule, model.prices_from, model.rates.cached_input) == ("openai", "models.gpt-4o*", 0.5)
    model = cost_model(load_replay_config(None, {"model": "gpt-5-mini"}))
    assert (model.prices_from, model.rates.cached_input, model.rates.output) == ("models.gpt-5*", 0.1, 8.0)
    model = cost_model(load_replay_config(None, {"model": "local-llm", "dialect": "anthropic"}))
    assert (model.rule, model.prices_from, model.rates.cache_write) == ("anthropic", "anthropic", 1.25)
    model = cost_model(load_replay_config(None, {"model": "claude-sonnet-4", "cache": {"rule": "none"}}))
    assert (model.rule, model.prices_from, model.rates.cached_input) == ("none", "models.claude-*", 0.1)
    # Gemini's implicit cache is automatic prefix caching: OpenAI's rule, through both its doors.
    for door in ("gemini", "code_assist"):
        model = cost_model(load_replay_config(None, {"model": "gemini-2.5-pro", "dialect": door}))
        figures = (model.rule, model.prices_from, model.rates.cached_input)
        assert figures == ("openai", "models.gemini-*", 0.25)


def test_an_arm_cost_adds_cache_reads_summaries_and_read_rounds() -> None:
    model = cost_model(load_replay_config(None, {"prices": {"summarizer_input": 0.5}}))
    session = growing(3)  # prompts 2000, 2300, 2600; cached 0, 1920, 2176
    read = shape([*zip(session[-1].ids, session[-1].tokens, strict=True), (50, 100)], kind="step_read")
    probe = shape([(0, 500), (99, 9000)], kind="question")
    cost = arm_cost(
        [[*session, read, probe], growing(1)], model, cases=2, summarizer_input=1000, summarizer_output=100
    )
    assert cost["requests"] == 5 and cost["prompt_tokens"] == 2000 + 2300 + 2600 + 2700 + 2000
    assert cost["cached_tokens"] == 1920 + 2176 + 2560
    assert cost["uncached_tokens"] == cost["prompt_tokens"] - cost["cached_tokens"]
    assert cost["cache_hit_share"] == round(6656 / 11600, 4)
    assert cost["read_round_tokens"] == {"requests": 1, "input": 2700, "cached": 2560, "output": 0}
    assert cost["summarizer_tokens"] == {"input": 1000, "output": 100}
    effective = (11600 - 6656) + 6656 * 0.5 + 1000 * 0.5 + 100 * 4.0
    assert cost["effective_input_tokens"] == effective
    assert cost["effective_input_tokens_mean"] == effective / 2
    assert "answering" not in cost


def test_effective_vs_full_and_the_cost_per_successful_answer() -> None:
    model = cost_model(load_replay_config(None))
    answer = shape([(0, 500), (1, 1500), (7, 200)], kind="answer", output=50)
    answer_read = shape([(0, 500), (1, 1500), (7, 200), (8, 300)], kind="answer_read", output=20)
    arms = {
        "full": {"cost": arm_cost([growing(3)], model, cases=1)},
        "cut": {"cost": arm_cost([[*growing(2), answer, answer_read]], model, cases=1)},
        "shadow": {"cost": None},
    }
    compare_to_full(arms)
    full, cut = arms["full"]["cost"], arms["cut"]["cost"]
    assert full["effective_vs_full"] == 1.0
    assert cut["effective_vs_full"] == round(
        cut["effective_input_tokens"] / full["effective_input_tokens"], 4
    )
    answering = cut["answering"]
    assert answering["requests"] == 2 and answering["output_tokens"] == 70
    assert cut["read_round_tokens"]["requests"] == 1 and cut["requests"] == 2
    questions = [
        {
            "answers": [
                {"arm_label": "cut", "repeat": 0, "judge": {"correct": True}, "exact": {"correct": False}},
                {"arm_label": "cut", "repeat": 1, "judge": {"correct": None}, "exact": {"correct": True}},
            ]
        },
        {"answers": [{"arm_label": "cut", "repeat": 0, "judge": {"correct": False}}]},
    ]
    figure = per_successful_answer(cut, questions)
    assert figure is not None and (figure["runs"], figure["graded"], figure["correct"]) == (2, 3, 2)
    total = 2 * cut["effective_input_tokens"] + answering["effective_input_tokens"]
    assert figure["effective_input_tokens"] == round(total / 2, 1)
    assert per_successful_answer(cut, [{"answers": [{"arm_label": "cut", "repeat": 0}]}]) is None
    assert per_successful_answer(full, questions) is None  # no answering requests
