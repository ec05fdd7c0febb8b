from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import main
from proxy.config.settings import ConfigError, Settings, load_settings, to_builtins

ROOT = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yml"
    path.write_text(text)
    return path


def test_repository_config_equals_the_built_in_defaults() -> None:
    assert to_builtins(load_settings(ROOT / "config.yml", env={})) == to_builtins(Settings())


def test_no_file_means_built_in_defaults() -> None:
    settings = load_settings(env={})
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 8080)
    assert settings.upstream.base_url == "https://api.openai.com/v1"
    assert settings.state_dir == "./var"
    assert (settings.mode, settings.policy) == ("enforce", "improved")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("upstream:\n  base_ur1: http://x\n", "`upstream.base_ur1`: unknown key"),
        ("surprise: 1\n", "`surprise`: unknown key"),
        ("upstream:\n  timeout: soon\n", "`upstream.timeout`: Expected `float`, got `str`"),
        ("upstream:\n  timeout: -1\n", "`upstream.timeout`: Expected `float` > 0.0"),
        ("server:\n  port: 70000\n", "`server.port`: Expected `int` <= 65535"),
        ("mode: sometimes\n", "`mode`: Invalid enum value 'sometimes'"),
        ("upstream:\n  base_url: ftp://x\n", "`upstream`: must be an http:// or https:// URL"),
        ("upstream:\n  base_url: http://u:pw@x/v1\n", "`upstream`: must not hold user:password@"),
        ("policy: missing\n", "is not one of the configured policies"),
        ("policies:\n  full:\n    stages: []\n    colour: red\n", "`policies.full.colour`: unknown key"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_bad_configuration_names_the_file_and_the_key(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={})
    message = str(caught.value)
    assert str(path) in message
    assert expected in message


def test_environment_overrides_file_and_command_line_overrides_both(tmp_path: Path) -> None:
    path = write(tmp_path, "upstream:\n  base_url: http://file/v1\nserver:\n  port: 9000\n")
    env = {
        "COMPACTION_PROXY_UPSTREAM_URL": "http://env/v1",
        "COMPACTION_PROXY_UPSTREAM_API_KEY": "sk-env",
    }
    settings = load_settings(path, env=env, overrides={"server.port": 9100, "server.host": None})
    assert settings.upstream.base_url == "http://env/v1"
    assert settings.upstream.api_key == "sk-env"
    assert settings.server.port == 9100
    assert settings.server.host == "127.0.0.1"


def test_config_path_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "mode: shadow\n")
    assert load_settings(env={"COMPACTION_PROXY_CONFIG": str(path)}).mode == "shadow"


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration file"):
        load_settings(tmp_path / "nope.yml", env={})


def test_cli_refuses_to_start_on_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "upstream:\n  timeout: -5\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert "upstream.timeout" in capsys.readouterr().err


def test_cli_refuses_unknown_policy_stages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "policies:\n  full:\n    stages:\n      - frobnicate: {}\n")
    assert main(["check-config", "--config", str(path)]) == 2
    assert "unknown stage 'frobnicate'" in capsys.readouterr().err


def test_check_config_hides_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "upstream:\n  api_key: sk-very-secret\n")
    assert main(["check-config", "--config", str(path), "--full"]) == 0
    out = capsys.readouterr().out
    assert "sk-very-secret" not in out and "api_key: <set>" in out
    assert main(["check-config", "--config", str(path)]) == 0
    assert "sk-very-secret" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("key", "url", "fixed"),
    [
        ("upstream.base_url", "http://127.0.0.1:8000", "use http://127.0.0.1:8000/v1"),
        ("upstream.base_url", "http://127.0.0.1:8000/", "use http://127.0.0.1:8000/v1"),
        ("upstream.base_url", "http://gpu:8000/v1/chat/completions", "use http://gpu:8000/v1"),
        ("upstream.base_url", "https://api.openai.com/v1/responses", "use https://api.openai.com/v1"),
        ("upstream.base_url", "http://h/openai/v1/chat/completions/", "use http://h/openai/v1"),
        ("anthropic.base_url", "https://api.anthropic.com/v1/messages", "use https://api.anthropic.com"),
    ],
)
def test_a_base_url_without_its_version_or_with_an_endpoint_path_is_refused_with_the_fix(
    key: str, url: str, fixed: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(env={}, overrides={key: url})
    message = str(refused.value)
    assert fixed in message and "\n" not in message


@pytest.mark.parametrize(
    "url",
    [
        "https://api.openai.com/v1",
        "http://localhost:11434/v1/",
        "https://generativelanguage.googleapis.com/v1beta/openai",
        "https://api.perplexity.ai",
        "https://openrouter.ai/api/v1",
    ],
)
def test_usual_base_urls_pass(url: str) -> None:
    assert load_settings(env={}, overrides={"upstream.base_url": url}).upstream.base_url == url


def test_a_bad_value_from_the_environment_names_its_variable() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(env={"COMPACTION_PROXY_UPSTREAM_URL": "http://127.0.0.1:8001"})
    assert "built-in defaults with COMPACTION_PROXY_UPSTREAM_URL" in str(refused.value)
