"""``check-config``: short by default, every setting with ``--full``, one verdict line last."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from proxy.cli import main
from proxy.commands.check_config import SETTING_VARIABLES


@pytest.fixture(autouse=True)
def _no_setting_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*SETTING_VARIABLES, "COMPACTION_PROXY_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def config(tmp_path: Path, **settings: object) -> str:
    path = tmp_path / "my.yml"
    path.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "var"), **settings}))
    return str(path)


def test_the_default_output_is_short_and_ends_with_the_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, policy="n_latest_10", mode="shadow")
    assert main(["check-config", "--config", path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) < 30 and lines[0] == f"# settings: {path}"
    assert any(line.startswith("# effective policies (default: n_latest_10") for line in lines)
    assert lines[-1].startswith(f"OK: {path} is valid: policy n_latest_10 in shadow mode (the upstream")
    assert "upstream https://api.openai.com/v1;" in lines[-1] and "models table entries" in lines[-1]
    assert not any(line.startswith("server:") for line in lines)
    assert (
        "# Host names served: localhost, any IP address, 127.0.0.1 (others get a 421: server.allowed_hosts)"
        in lines
    )


def test_the_host_names_served_are_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = config(tmp_path, server={"host": "0.0.0.0", "allowed_hosts": ["proxy", "proxy.ns.svc"]})
    assert main(["check-config", "--config", path]) == 0
    assert "Host names served: localhost, any IP address, proxy, proxy.ns.svc (" in capsys.readouterr().out
    path = config(tmp_path, server={"allowed_hosts": ["*"]})
    assert main(["check-config", "--config", path]) == 0
    assert "# Host names served: any (" in capsys.readouterr().out


def test_full_prints_every_setting_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "--config", config(tmp_path), "--full"]) == 0
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out[: out.index("# settings:")])
    assert resolved["server"]["port"] == 8080 and resolved["policy"] == "improved"
    assert out.splitlines()[-1].startswith("OK: ")


def test_the_verdict_says_what_to_look_at(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_UPSTREAM_URL", "http://127.0.0.1:9/v1")
    # Without window learning, a local server's unknown model names are worth a warning.
    path = config(
        tmp_path, models={"default": {"window": 32000}}, policy="full", upstream={"learn_windows": False}
    )
    assert main(["check-config", "--config", path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"# settings: {path}, overridden by COMPACTION_PROXY_UPSTREAM_URL"
    verdict = lines[-1]
    assert verdict.startswith("OK with 1 warning: ")
    assert "policy full in enforce mode (compacts nothing)" in verdict
    assert "Look at: 127.0.0.1 serves model names unknown here" in verdict


def test_built_in_defaults_and_uncovered_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("OK: the built-in defaults are valid: ")
    # A file's own `context_windows` replaces the table derived from `models` entirely.
    path = config(tmp_path, context_windows={"default": 32000})
    assert main(["check-config", "--config", path]) == 0
    verdict = capsys.readouterr().out.splitlines()[-1]
    assert verdict.startswith("OK with 4 warnings: ") and "usual api.openai.com model names get" in verdict
    # The Gemini API's and Code Assist's usual names are checked too.
    assert "gemini https://generativelanguage.googleapis.com" in verdict
    assert "usual generativelanguage.googleapis.com model names get" in verdict
    assert "usual cloudcode-pa.googleapis.com model names get" in verdict


def test_a_bad_configuration_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", "--config", config(tmp_path, mode="loud")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1 and "mode" in captured.err


def test_the_windows_learned_from_the_providers_are_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.state.learned_windows import ConfiguredModels, LearnedWindows

    upstream = "http://127.0.0.1:8000/v1"
    path = config(tmp_path, upstream={"base_url": upstream}, state_dir=str(tmp_path / "state"))
    assert main(["check-config", "--config", path]) == 0
    assert "# windows learned from the providers" in capsys.readouterr().out  # "none yet"
    learned = LearnedWindows(
        tmp_path / "state" / "learned_windows.json", [f"{upstream}"], ConfiguredModels([])
    )
    learned.learn("http://127.0.0.1:8000/v1", "qwen-coder", 8192, "refusal 400")
    learned.learn("http://elsewhere:80/v1", "other", 4096, "refusal 400")  # not this upstream: not kept
    assert main(["check-config", "--config", path]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "qwen-coder" in line)
    assert "8,192 tokens" in row and "from refusal 400" in row
    assert "other" not in out.split("# windows learned")[1]
    assert "asked from it once" in out  # the local server's unknown names: learned, not guessed
