"""Every subcommand of ``compaction-proxy`` (``replay``'s too, at any depth) says in one line
what it does in its parent's ``--help``, and its own ``--help`` shows its own description."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from proxy.cli import build_parser, main


def subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str | None, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), helps.get(name), sub
                yield from subcommands(sub, (*path, name))


def every_subcommand() -> list[tuple[tuple[str, ...], str | None, argparse.ArgumentParser]]:
    # `replay` is registered for real only when it is the command asked for.
    return list(subcommands(build_parser(["replay"])))


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_the_walk_finds_the_nested_commands() -> None:
    paths = {path for path, _, _ in every_subcommand()}
    assert {("canary", "status"), ("canary", "resume"), ("replay", "run"), ("replay", "tune")} <= paths
    assert {("events",), ("check-config",), ("wrap",), ("serve",), ("healthcheck",)} <= paths


@pytest.mark.parametrize("path", [path for path, _, _ in every_subcommand()], ids=" ".join)
def test_a_subcommand_has_a_help_line_and_its_own_help(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    found = {p: (summary, parser) for p, summary, parser in every_subcommand()}
    summary, parser = found[path]
    assert summary and summary.strip() and "\n" not in summary, f"{path}: no one-line help"
    assert parser.description, f"{path}: --help would not say what it does"
    with pytest.raises(SystemExit) as stopped:
        main([*path, "--help"])
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: compaction-proxy {' '.join(path)}"), out[:200]
    assert flat(parser.description) in flat(out)
    parent = found.get(path[:-1])
    if parent is not None:
        assert flat(parent[1].description or "") not in flat(out)


def test_the_top_help_lists_every_command_with_its_summary(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = flat(capsys.readouterr().out)
    for path, summary, _ in every_subcommand():
        if len(path) == 1:
            assert f"{path[0]} {flat(summary or '')}" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["canary", "status", "--config", "my.yml", "--json"],
        ["canary", "--config", "my.yml", "status", "--json"],
        ["canary", "--json", "--config", "my.yml", "status"],
    ],
)
def test_canary_status_takes_its_options_before_or_after_the_action(argv: list[str]) -> None:
    args = build_parser(argv).parse_args(argv)
    assert (args.action, args.config, args.json) == ("status", "my.yml", True)


def test_canary_resume_and_status_defaults() -> None:
    args = build_parser().parse_args(["canary", "resume"])
    assert (args.action, args.config, args.json) == ("resume", None, False)
    args = build_parser().parse_args(["canary", "status"])
    assert (args.action, args.config, args.json) == ("status", None, False)
