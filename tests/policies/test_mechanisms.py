"""Example tests, one behaviour each, for every mechanism; the seed's Figure 5 included."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import policies.stages.retry_collapse as retry_collapse
from policies.conversation import message_text, parse
from policies.handles import is_placeholder
from policies.ledger_extraction import build_ledger
from policies.pipeline import Checkpoint, PolicyOutcome, build_policy
from policies.stages.micro_compact import PLACEHOLDER
from policies.summarizer import SummaryRequest, SummaryResult
from policies.tokens import TokenCounter

COUNTER = TokenCounter()


def call(call_id: str, command: str, tool: str = "execute_bash") -> dict[str, Any]:
    arguments = {"command": command} if tool == "execute_bash" else {"command": "view", "path": command}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(arguments)},
            }
        ],
    }


def result(call_id: str, text: str, tool: str = "execute_bash") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": tool, "content": text}


def step(call_id: str, command: str, text: str, tool: str = "execute_bash") -> list[dict[str, Any]]:
    return [call(call_id, command, tool), result(call_id, text, tool)]


def words(n: int, seed: str = "w") -> str:
    return " ".join(f"{seed}{i % 97}" for i in range(n))


def apply(policy: Any, messages: list[Any], window: int, **kwargs: Any) -> PolicyOutcome:
    outcome: PolicyOutcome = asyncio.run(
        policy.apply({"model": "gpt-4o", "messages": messages}, COUNTER, window=window, **kwargs)
    )
    return outcome


def view_of(outcome: PolicyOutcome, messages: list[Any]) -> list[Any]:
    return outcome.messages if outcome.messages is not None else messages


class CountingSummarizer:
    def __init__(self) -> None:
        self.requests: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.requests.append(request)
        return SummaryResult(
            text=f"Narrative {len(self.requests)}.", model="fake", prompt_family=request.prompt_family
        )


SYSTEM = {"role": "system", "content": "You are a coding agent."}
TASK = {"role": "user", "content": "Fix the failing test in tests/test_parse.py"}


# --- n_latest -----------------------------------------------------------------------------


def test_n_latest_keeps_system_and_question_outside_the_count_and_never_splits_an_exchange() -> None:
    history = [SYSTEM, TASK]
    for i in range(6):
        history += step(f"c{i}", f"cmd {i}", f"out {i}")
    policy = build_policy("n", "", [{"n_latest": {"n": 5}}], safeguard=False)
    outcome = apply(policy, history, 128_000)
    view = view_of(outcome, history)
    # 5 messages back from the end lands on a tool result: the cut moves forward to the call.
    assert view == [SYSTEM, TASK, *history[-4:]]
    assert outcome.facts.n_latest.retained_history_messages == 4
    assert parse(view).problems == ()


def test_n_latest_token_safeguard_trims_complete_exchanges() -> None:
    history = [SYSTEM, TASK]
    for i in range(6):
        history += step(f"c{i}", f"cmd {i}", words(400))
    policy = build_policy("n", "", [{"n_latest": {"n": 40, "max_share": 0.5}}], safeguard=False)
    outcome = apply(policy, history, 4_000)
    assert outcome.tokens_after <= 2_000
    assert parse(view_of(outcome, history)).problems == ()


def numbered_lines(n: int) -> str:
    return "\n".join(f"line {i}: " + words(12, f"x{i}") for i in range(n))


def test_safeguard_cuts_an_output_larger_than_the_window_to_an_excerpt_with_a_handle() -> None:
    big = numbered_lines(600)  # ~24k tokens, in the final step: nothing older to drop
    history = [SYSTEM, TASK, *step("c0", "find / -name '*.py'", big)]
    for name, stages in [("n_latest", [{"n_latest": {"n": 10}}]), ("trigger", [{"trigger": {}}])]:
        policy = build_policy(name, "", stages, safeguard=True)
        outcome = apply(policy, history, 8_192)
        view = view_of(outcome, history)
        assert outcome.tokens_before > 8_192
        assert outcome.tokens_after <= 8_192 - 1024
        assert outcome.facts.token_safeguard.over_budget is False
        text = message_text(view[-1])
        assert text.startswith("[Output cut to fit the context window: handle=out_")
        # First and last lines are kept; the whole output is saved under the named handle.
        assert "line 0:" in text and "line 599:" in text and "line 300:" not in text
        (offload,) = outcome.offloads.values()
        assert offload.content == big and offload.handle in text
        assert parse(view).problems == ()
    # Sticky: the next request carries the same excerpt (the prompt prefix stays stable).
    policy = build_policy("improved_like", "", [{"trigger": {"high": 0.8}}], safeguard=True)
    first = apply(policy, history, 8_192)
    history2 = [*history, *step("c1", "ls", "short")]
    second = apply(policy, history2, 8_192, checkpoint=first.checkpoint)
    assert view_of(second, history2)[: len(history)] == view_of(first, history)


# --- sre: micro_compact and auto_compact --------------------------------------------------


def test_micro_compact_clears_old_turn_results_and_keeps_them_cleared() -> None:
    history = [SYSTEM, {"role": "user", "content": "turn 1"}]
    for i in range(7):
        history += step(f"a{i}", f"cmd {i}", words(200, f"t{i}"))
    history += [{"role": "user", "content": "turn 2"}, *step("b0", "ls", "short")]
    policy = build_policy("sre", "", [{"micro_compact": {}}], safeguard=False)
    outcome = apply(policy, history, 128_000)
    view = view_of(outcome, history)
    cleared = [m for m in view if m.get("content") == PLACEHOLDER]
    # 7 old results, newest max(5, 1 current-turn result) = 5 results kept: 3 old ones cleared.
    assert len(cleared) == 3
    assert view[-1] is history[-1]
    # The next request reuses the same placeholders, and (as shipped) clears one more:
    # the newest 5 results now end one result later. sre is not prefix-stable.
    history2 = [*history, *step("b1", "ls -la", "short again")]
    second = view_of(apply(policy, history2, 128_000, checkpoint=outcome.checkpoint), history2)
    assert all(second[i] == m for i, m in enumerate(view) if m.get("content") == PLACEHOLDER)
    assert sum(1 for m in second if m.get("content") == PLACEHOLDER) == 4


def test_auto_compact_summarizes_before_the_last_user_message_once_per_compaction() -> None:
    history = [SYSTEM, {"role": "user", "content": "first question"}]
    for i in range(5):
        history += step(f"a{i}", f"cmd {i}", words(300, f"x{i}"))
    history.append({"role": "user", "content": "second question"})
    summarizer = CountingSummarizer()
    policy = build_policy("sre", "", [{"auto_compact": {"trigger": 0.8}}], safeguard=False)
    outcome = apply(policy, history, 2_500, summarizer=summarizer)
    view = view_of(outcome, history)
    assert [m.get("role") for m in view] == ["system", "user", "user"]
    assert "Narrative 1." in view[1]["content"] and view[2] is history[-1]
    assert outcome.trigger == "threshold" and outcome.checkpoint.compactions == 1
    # Later requests that extend the history reuse the summary byte for byte, no new call.
    checkpoint = outcome.checkpoint
    for i in range(3):
        history = [*history, *step(f"n{i}", "ls", "ok")]
        later = apply(policy, history, 2_500, checkpoint=checkpoint, summarizer=summarizer)
        assert view_of(later, history)[1] == view[1]
        checkpoint = later.checkpoint
    assert len(summarizer.requests) == 1


def test_a_diverged_history_drops_the_checkpoint() -> None:
    history = [
        SYSTEM,
        {"role": "user", "content": "q1"},
        *step("a", "cmd", words(900)),
        {"role": "user", "content": "q2"},
    ]
    policy = build_policy("sre", "", [{"auto_compact": {"trigger": 0.5}}], safeguard=False)
    first = apply(policy, history, 2_000)
    assert first.checkpoint.summary is not None
    edited = [*history[:3], result("a", "edited by the agent"), history[4]]
    second = apply(policy, edited, 100_000, checkpoint=first.checkpoint)
    assert second.facts.checkpoint_dropped
    assert second.messages is None  # small again: sent as the client sent it


# --- improved: the seed's Figure 5 ----------------------------------------------------------


def figure_5() -> list[Any]:
    """S1 tree, S2 reproduction, S3 full test run (large), S4 source view, S5-S7 tool errors,
    S8 runs the test (failing assertion), S9 an edit, S10 a large view, then U2."""
    history: list[Any] = [SYSTEM, TASK]
    history += step("s1", "find . -name '*.py'", "./src/parse.py\n./tests/test_parse.py\n[exit code 0]")
    history += step(
        "s2",
        "python reproduce.py",
        "Traceback (most recent call last):\nValueError: bad token\n[exit code 1]",
    )
    history += step("s3", "pytest -q", words(4000, "log") + "\n1 failed, 49 passed in 8.42s\n[exit code 1]")
    history += step("s4", "src/parse.py", words(600, "src"), tool="str_replace_editor")
    for i in (5, 6, 7):
        history += step(
            f"s{i}", "pytest tests/test_parse.py", f"ERROR: file or directory not found {i}\n[exit code 4]"
        )
    history += step(
        "s8",
        "pytest tests/test_parse.py",
        "E   AssertionError: assert 1 == 2\n1 failed in 0.1s\n[exit code 1]",
    )
    history += step("s9", "src/parse.py", "edited:\n" + words(100, "diff"), tool="str_replace_editor")
    history += step("s10", "src/parse.py", words(1420, "view"), tool="str_replace_editor")
    history.append({"role": "user", "content": "U2: what did the first test run report?"})
    return history


IMPROVED = [
    {"trigger": {"high": 0.8}},
    {"retry_collapse": {}},
    {"offload": {"min_tokens": 1000, "keep_recent": 5}},
    # A low target, so that offloading alone does not suffice and the figure's cut happens.
    {"summarize": {"target": 0.2, "retained_tail": 0.2}},
    {"verify_guidance": {}},
]


def test_figure_5_retry_collapse_offloading_and_step_aware_cut() -> None:
    history = figure_5()
    window = 15_000  # retained tail 0.2 x 15k = 3,000 tokens, as in the figure
    summarizer = CountingSummarizer()
    policy = build_policy("improved", "", IMPROVED)
    outcome = apply(policy, history, window, summarizer=summarizer)
    view = view_of(outcome, history)
    assert parse(view).problems == ()
    assert outcome.mechanisms[:1] == ("retry_collapse",) or "retry_collapse" in outcome.mechanisms
    assert {"offload", "summarize", "verify_guidance"} <= set(outcome.mechanisms)
    # System, guidance, task, summary, then the newest whole steps that fit the low-water
    # target (0.2 x 15k for the whole request: with the summary and the answer's reserve, U2).
    assert view[0] is SYSTEM and view[1]["role"] == "system" and "read_tool_output" in view[1]["content"]
    assert view[2] is TASK
    assert view[3]["content"].startswith("[Summary of the earlier conversation")
    assert view[4:] == history[-1:]
    assert outcome.facts.summarize is not None and outcome.facts.summarize.request_tokens <= 3_000
    # The summarizer saw S8 with its retry note, never the collapsed attempts S5-S7.
    seen = "\n".join(message_text(m) for m in summarizer.requests[0].messages)
    assert "Retry note: 3 earlier attempt(s)" in seen
    assert "first failure: ERROR: file or directory not found 5" in seen
    assert "not found 6" not in seen and "not found 7" not in seen
    # The collapsed attempts' outputs are saved, and the note names their handles.
    collapsed = [
        h
        for h, o in outcome.offloads.items()
        if ("not found 6" in o.content or "not found 7" in o.content) and "attempts" not in o.description
    ]
    assert len(collapsed) == 2
    assert all(f"handle={h}" in seen for h in collapsed)
    # So are the attempts whole: the agent's calls (and any words it wrote) with their outputs.
    (attempts,) = [
        o for o in outcome.offloads.values() if o.description == "the collapsed attempts, verbatim"
    ]
    assert "pytest tests/test_parse.py" in attempts.content and "not found 5" in attempts.content
    assert f"handle={attempts.handle}" in seen
    # The large S3 output was offloaded: its handle is in the summary, its content saved.
    (handle,) = [h for h, o in outcome.offloads.items() if "1 failed, 49 passed" in o.content]
    assert f"handle={handle}" in view[3]["content"]
    assert "1 failed, 49 passed in 8.42s" in view[3]["content"]  # the ledger's test summary
    assert outcome.tokens_after <= 0.2 * window + 500


def test_improved_is_cache_stable_between_compactions() -> None:
    history = figure_5()
    summarizer = CountingSummarizer()
    policy = build_policy("improved", "", IMPROVED)
    first = apply(policy, history, 15_000, summarizer=summarizer)
    previous = view_of(first, history)
    checkpoint = first.checkpoint
    for i in range(4):
        history = [*history, *step(f"n{i}", f"cmd {i}", words(50))]
        outcome = apply(policy, history, 15_000, checkpoint=checkpoint, summarizer=summarizer)
        view = view_of(outcome, history)
        assert view[: len(previous)] == previous, "the prefix must only grow between compactions"
        previous, checkpoint = view, outcome.checkpoint
    assert len(summarizer.requests) == 1


def test_improved_compacts_again_with_the_previous_summary_and_keeps_ledger_items() -> None:
    history = figure_5()
    summarizer = CountingSummarizer()
    policy = build_policy("improved", "", IMPROVED)
    outcome = apply(policy, history, 15_000, summarizer=summarizer)
    checkpoint = outcome.checkpoint
    for i in range(16):
        history = [*history, *step(f"m{i}", f"python check_{i}.py", words(300, f"m{i}") + "\n[exit code 0]")]
        outcome = apply(policy, history, 15_000, checkpoint=checkpoint, summarizer=summarizer)
        checkpoint = outcome.checkpoint
    assert checkpoint.compactions >= 2
    assert summarizer.requests[-1].previous_summary is not None
    summary = next(m for m in view_of(outcome, history) if message_text(m).startswith("[Summary"))
    # Exact items from the first cycle survive the second.
    assert "1 failed, 49 passed in 8.42s" in summary["content"]
    assert "`python reproduce.py` -> 1" in summary["content"]


def test_an_active_retry_chain_stays_intact() -> None:
    history: list[Any] = [SYSTEM, TASK, *step("p", "ls", words(3000))]
    for i in range(3):
        history += step(f"r{i}", "pytest tests/test_parse.py", f"ERROR: not found {i}\n[exit code 4]")
    policy = build_policy("r", "", [{"trigger": {"high": 0.1}}, {"retry_collapse": {}}], safeguard=False)
    view = view_of(apply(policy, history, 10_000), history)
    assert sum(1 for m in view if "not found" in message_text(m)) == 3


def test_a_history_without_a_failed_output_is_not_taken_apart_for_retries(monkeypatch: Any) -> None:
    """A settled chain has a failed attempt: with none, the stage never reads the steps."""
    history: list[Any] = [SYSTEM, TASK]
    for i in range(6):
        history += step(f"c{i}", "pytest tests/test_parse.py", words(400, f"o{i}"))
    actions: list[int] = []
    original = retry_collapse.action_of

    def counted(*args: Any) -> Any:
        actions.append(1)
        return original(*args)

    monkeypatch.setattr(retry_collapse, "action_of", counted)
    policy = build_policy("r", "", [{"trigger": {"high": 0.1}}, {"retry_collapse": {}}], safeguard=False)
    outcome = apply(policy, history, 10_000)
    assert outcome.trigger and "retry_collapse" not in outcome.mechanisms and actions == []
    # One failed output: the steps are read (and a lone failure settles nothing).
    history[-1] = {**history[-1], "content": "ERROR: not found\n[exit code 4]"}
    outcome = apply(policy, history + step("z", "ls", "ok"), 10_000)
    assert actions and "retry_collapse" not in outcome.mechanisms


def test_pins_exempt_tools_from_offloading_and_summaries() -> None:
    history: list[Any] = [SYSTEM, TASK, *step("m", "memory", words(1500, "mem"), tool="memory")]
    for i in range(6):
        history += step(f"c{i}", f"cmd {i}", words(800, f"o{i}"))
    history += step("last", "ls", "ok")
    policy = build_policy("p", "", IMPROVED, pin_tools=["memory"])
    outcome = apply(policy, history, 8_000)
    view = view_of(outcome, history)
    assert history[3] in view and history[2] in view  # the pinned exchange, verbatim
    assert parse(view).problems == ()
    assert all(not is_placeholder(message_text(m)) for m in view if m.get("name") == "memory")


def test_thrash_is_limited_while_the_view_fits() -> None:
    """A session that compacted 3 times in its last 6 requests keeps its view while it fits
    the window; once it does not, it compacts anyway (the safeguard would drop steps)."""
    from policies.pipeline import Context, View
    from policies.stages.trigger import Trigger

    thrashing = Checkpoint(requests=10, compactions=3, recent_compactions=(7, 8, 9))
    history: list[Any] = [SYSTEM, TASK]
    for i in range(8):
        history += step(f"h{i}", f"cmd {i}", words(400, f"h{i}"))
    ctx = Context(counter=COUNTER, encoding="o200k_base", window=0)
    tokens = sum(COUNTER.count_messages(history, "o200k_base"))

    async def trigger(window: int) -> View:
        view = View(
            messages=list(history), original=history, origin=list(range(len(history))), checkpoint=thrashing
        )
        ctx.window = window
        return await Trigger(high=0.8).apply(view, ctx)

    fits = asyncio.run(trigger(int(tokens / 0.85)))  # over 0.8 x window, under window - 1024
    assert not fits.compacting and fits.facts.trigger.limited == "re-triggering too often"
    over = asyncio.run(trigger(tokens + 500))  # no room left for the answer
    assert over.compacting and over.facts.trigger.limited.startswith("overridden")


def test_a_limited_session_compacts_rather_than_drop_steps_without_a_trace() -> None:
    """At a window that every new output crosses, limiting would leave the safeguard to drop
    whole steps: the session compacts, and every command is in the view or in the ledger (the
    one shown, or the complete one it names by handle when its lists are cut to fit)."""
    policy = build_policy("improved", "", IMPROVED)
    history: list[Any] = [SYSTEM, TASK]
    checkpoint: Checkpoint | None = None
    saved: dict[str, str] = {}
    for i in range(12):
        history += step(f"h{i}", f"cmd {i}", words(900, f"h{i}"))
        outcome = apply(policy, history, 3_000, checkpoint=checkpoint)
        checkpoint = outcome.checkpoint
        saved.update({h: o.content for h, o in outcome.offloads.items()})
        assert outcome.tokens_after <= 3_000
        view = json.dumps(outcome.messages if outcome.messages is not None else history)
        readable = view + "".join(saved[h] for h in re.findall(r"out_[0-9a-f]{16}", view) if h in saved)
        for n in range(i + 1):
            assert f"cmd {n}" in readable, (i, n)


# --- the state ledger -------------------------------------------------------------------------


def test_ledger_extracts_exact_items_from_native_tool_calls() -> None:
    history = figure_5()
    tracker = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "t1",
                "type": "function",
                "function": {
                    "name": "task_tracker",
                    "arguments": json.dumps(
                        {
                            "command": "plan",
                            "task_list": [
                                {"title": "Write regression test", "status": "todo"},
                                {"title": "Reproduce", "status": "done"},
                            ],
                        }
                    ),
                },
            }
        ],
    }
    ledger = build_ledger([*history, tracker, result("t1", "ok", "task_tracker")])
    assert ledger.goal == TASK["content"]
    files = {f.path: (f.views, f.edits) for f in ledger.files}
    assert files["src/parse.py"] == (3, 0)
    commands = {c.command: c.exit_code for c in ledger.commands}
    assert commands["python reproduce.py"] == 1 and commands["pytest -q"] == 1
    assert "ValueError: bad token" in ledger.errors
    assert "1 failed, 49 passed in 8.42s" in ledger.test_summaries
    assert ledger.open_items == ("Write regression test",)
    text = ledger.render()
    assert text == build_ledger([*history, tracker, result("t1", "ok", "task_tracker")]).render()


def test_ledger_reads_text_actions() -> None:
    history = [
        SYSTEM,
        TASK,
        {
            "role": "assistant",
            "content": "Let me run it.\n<function=bash>\n<parameter=command>\npytest -x\n"
            "</parameter>\n</function>",
        },
        {
            "role": "user",
            "content": "OBSERVATION:\nFAILED tests/test_a.py::test_x\n2 failed, 10 passed in 1.0s",
        },
        {
            "role": "assistant",
            "content": "<function=str_replace_editor>\n<parameter=command>str_replace</parameter>\n"
            "<parameter=path>/repo/a.py</parameter>\n</function>",
        },
        {"role": "user", "content": "The file /repo/a.py has been edited."},
    ]
    ledger = build_ledger(history)
    assert [c.command for c in ledger.commands] == ["pytest -x"]
    assert ledger.files[0].path == "/repo/a.py" and ledger.files[0].edits == 1
    assert any("2 failed, 10 passed" in t for t in ledger.test_summaries)


def test_a_plain_multi_turn_chat_is_not_a_text_action_agent() -> None:
    chat = [SYSTEM, TASK]
    for i in range(4):
        chat += [
            {"role": "assistant", "content": f"answer {i}"},
            {"role": "user", "content": f"question {i}"},
        ]
    conversation = parse(chat)
    assert not conversation.text_actions
    assert conversation.last_user == len(chat) - 1
    agent = [*chat[:2]]
    for i in range(3):
        agent += [
            {"role": "assistant", "content": f"Run it.\n```\npython t{i}.py\n```"},
            {"role": "user", "content": "ok"},
        ]
    assert parse(agent).text_actions and parse(agent).last_user == 1
