"""Config people can read and extend: policies merge with the built-ins by name, a policy can
extend another and change a few knobs, one model table holds window, encoding and factor."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.pipeline import build_policies
from policies.tokens import DEFAULT_MODEL_ENCODINGS
from policies.windows import DEFAULT_CONTEXT_WINDOWS, ContextWindows
from proxy.cli import main
from proxy.config.settings import ConfigError, load_settings, policy_specs

ROOT = Path(__file__).resolve().parents[3]
BUILT_IN = {
    "full",
    "n_latest_10",
    "n_latest_20",
    "n_latest_40",
    "sre",
    "improved_tail",
    "improved_step",
    "improved_offload",
    "improved_retry",
    "improved",
    "improved_no_superseded",
}


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "my.yml"
    path.write_text(text)
    return load_settings(path, env={})


def stage(settings: object, policy: str, name: str) -> dict[str, object]:
    stages = settings.policies[policy].stages  # type: ignore[attr-defined]
    return next(s[name] for s in stages if name in s)


def test_a_users_policy_is_added_beside_the_built_ins(tmp_path: Path) -> None:
    settings = load(tmp_path, "policies:\n  mine:\n    stages:\n      - n_latest: {n: 4}\npolicy: mine\n")
    assert set(settings.policies) == BUILT_IN | {"mine"}  # type: ignore[attr-defined]
    build_policies(policy_specs(settings))  # type: ignore[arg-type]


def test_a_built_in_name_replaces_only_that_policy(tmp_path: Path) -> None:
    settings = load(tmp_path, "policies:\n  sre:\n    stages:\n      - n_latest: {n: 4}\n")
    assert settings.policies["sre"].stages == [{"n_latest": {"n": 4}}]  # type: ignore[attr-defined]
    assert stage(settings, "improved", "summarize")["target"] == 0.5


def test_extends_overrides_a_few_knobs_and_removes_a_stage(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        "policies:\n  lean:\n    extends: improved\n    overrides:\n"
        "      summarize: {target: 0.4}\n      offload: {min_tokens: 2000}\n      verify_guidance: null\n",
    )
    lean = settings.policies["lean"]  # type: ignore[attr-defined]
    assert [next(iter(s)) for s in lean.stages] == [
        "tail_offload",
        "trigger",
        "retry_collapse",
        "superseded_reads",
        "offload",
        "summarize",
    ]
    assert stage(settings, "lean", "summarize") == {
        "target": 0.4,
        "retained_tail": 0.2,
        "step_aware": True,
        "prompt": "hybrid_v2",
    }
    assert stage(settings, "lean", "offload")["min_tokens"] == 2000
    assert stage(settings, "lean", "offload")["keep_recent"] == 5
    assert "improved" in lean.description and "target=0.4" in lean.description
    # The parent is untouched.
    assert stage(settings, "improved", "summarize")["target"] == 0.5
    build_policies(policy_specs(settings))  # type: ignore[arg-type]


def test_extends_chains_and_a_built_in_name_can_extend_itself(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        "policies:\n"
        "  b:\n    extends: a\n    overrides: {trigger: {high: 0.7}}\n"
        "  a:\n    extends: improved\n    overrides: {summarize: {target: 0.3}}\n"
        "  improved:\n    extends: improved\n    overrides: {summarize: {retained_tail: 0.1}}\n",
    )
    assert stage(settings, "b", "trigger") == {"high": 0.7, "cold_high": 0.6, "write_grace": 1}
    assert stage(settings, "b", "summarize")["target"] == 0.3
    # `improved` extends the built-in one; `a` extends the user's `improved`.
    assert stage(settings, "improved", "summarize")["retained_tail"] == 0.1
    assert stage(settings, "a", "summarize")["retained_tail"] == 0.1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("policies:\n  x:\n    extends: nope\n", "`policies.x.extends`: no policy named 'nope'"),
        (
            "policies:\n  x:\n    extends: sre\n    overrides: {summarize: {target: 0.4}}\n",
            "`policies.x.overrides.summarize`: sre has no summarize stage (its stages: "
            "['micro_compact', 'auto_compact'])",
        ),
        (
            "policies:\n  x: {extends: y}\n  y: {extends: x}\n",
            "a cycle",
        ),
        ("policies:\n  x: {overrides: {trigger: {high: 0.7}}}\n", "only a policy that `extends`"),
        ("policies:\n  x: {extends: improved, stagez: []}\n", "`policies.x.stagez`: unknown key"),
        ("models:\n  m*: {windw: 1}\n", "`models.m*.windw`: unknown key"),
    ],
)
def test_merge_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        load(tmp_path, text)
    assert message in str(caught.value)
    assert "my.yml" in str(caught.value)


def test_a_bad_knob_in_overrides_is_named_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "my.yml"
    path.write_text("policies:\n  x:\n    extends: improved\n    overrides: {summarize: {targt: 0.4}}\n")
    assert main(["check-config", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "policies.x" in err and "targt" in err


def test_the_built_in_model_table_resolves_as_the_old_tables_did() -> None:
    settings = load_settings(env={})
    assert settings.context_windows == DEFAULT_CONTEXT_WINDOWS
    assert settings.tokens.model_encodings == DEFAULT_MODEL_ENCODINGS
    assert settings.tokens.model_factors == {"claude-*": 1.3, "gemini-*": 1.2}
    old = ContextWindows(DEFAULT_CONTEXT_WINDOWS)
    new = ContextWindows(settings.context_windows)
    for model in ("gpt-4o-mini", "gpt-4-turbo-2024", "gpt-4-0613", "gpt-3.5-turbo", "claude-x", "other"):
        assert new.window_for(model) == old.window_for(model)


def test_models_merge_by_pattern_and_new_patterns_come_first(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        "models:\n  gpt-4o-mini*: {window: 64000}\n  claude-*: {token_factor: 1.2}\n"
        "  default: {window: 32000}\n",
    )
    windows = ContextWindows(settings.context_windows)  # type: ignore[attr-defined]
    assert windows.window_for("gpt-4o-mini-2024") == 64000
    assert windows.window_for("gpt-4o") == 128000
    assert windows.window_for("claude-x") == 200000  # the built-in window, the user's factor
    assert settings.tokens.model_factors == {"claude-*": 1.2, "gemini-*": 1.2}  # type: ignore[attr-defined]
    assert windows.window_for("unknown") == 32000
    # The encoding of a new pattern falls through to the next entry that sets one.
    assert "gpt-4o-mini*" not in settings.tokens.model_encodings  # type: ignore[attr-defined]


def test_the_old_separate_table_still_replaces_its_part(tmp_path: Path) -> None:
    settings = load(tmp_path, "context_windows: {default: 4096}\n")
    assert settings.context_windows == {"default": 4096}  # type: ignore[attr-defined]
    assert ContextWindows(settings.context_windows).window_for("gpt-4o") == 4096  # type: ignore[attr-defined]


def test_check_config_lists_the_effective_policies_and_their_origin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "my.yml"
    path.write_text(
        "policy: lean\npolicies:\n  lean: {extends: improved, overrides: {verify_guidance: null}}\n"
        "  sre: {stages: [{n_latest: {n: 4}}]}\n  mine: {stages: []}\n"
    )
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    listing = out[out.index("# effective policies") :].splitlines()
    assert listing[0] == "# effective policies (default: lean; per request: X-Compaction-Policy):"
    rows = {line.split()[1]: " ".join(line.split()[2:]) for line in listing[1:]}
    stages = "tail_offload, trigger, retry_collapse, superseded_reads, offload, summarize"
    assert rows["lean"] == "extends improved " + stages
    assert rows["sre"] == "replaces the built-in n_latest"
    assert rows["mine"] == "yours no stages"
    assert rows["improved"].startswith("built-in tail_offload, trigger")


def test_the_starter_config_is_valid_and_short() -> None:
    text = (ROOT / "config.starter.yml").read_text()
    settings = load_settings(ROOT / "config.starter.yml", env={})
    assert settings.policy == "improved" and "lean" in settings.policies
    assert len([line for line in text.splitlines() if line and not line.lstrip().startswith("#")]) <= 20
