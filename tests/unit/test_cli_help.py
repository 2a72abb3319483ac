"""The ``lattice`` command's help texts (typer's CliRunner, no services)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from lattice_client.cli import app

runner = CliRunner()
COMMANDS = ["submit", "wait", "events", "status", "inbox", "cancel", "worker", "drain", "demo", "flower"]


def plain(text: str) -> str:
    """Help text without ANSI codes, box drawing and line wrapping."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    text = re.sub(r"[│╭╮╰╯─]", " ", text)
    return " ".join(text.split())


def test_top_level_help_lists_every_command_and_the_settings():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    text = plain(result.output)
    for command in COMMANDS:
        assert re.search(rf"\b{command}\b", text), command
    for option in ("--broker-url", "--mailbox-url", "--key-prefix"):
        assert option in text
    for env in (
        "LATTICE_BROKER_URL",
        "LATTICE_MAILBOX_URL",
        "LATTICE_KEY_PREFIX",
        "LATTICE_LEASE_SECONDS",
        "LATTICE_MAX_ATTEMPTS",
    ):
        assert env in text


def test_no_arguments_shows_help_not_a_traceback():
    result = runner.invoke(app, [])
    assert "Usage" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            "submit",
            [
                "TEAM",
                "PROMPT",
                "--wait",
                "--timeout",
                "--run-id",
                "--metadata",
                "--json",
                "lattice_worker.examples.team:team",
            ],
        ),
        ("wait", ["RUN_ID", "--timeout", "--json", "Exit code"]),
        ("events", ["RUN_ID", "--timeout", "JSON lines"]),
        ("status", ["TEAM", "--limit", "--json", "mailbox"]),
        ("inbox", ["MAILBOX", "--status", "pending", "all", "<team>::<member>"]),
        ("cancel", ["RUN_ID", "cancelled", "no worker online"]),
        ("worker", ["TEAM_REF", "--member", "--concurrency", "lead", "pass through"]),
        ("drain", ["TEAM_REF", "--member", "--max-rounds", "--max-messages"]),
        ("demo", ["DIRECTORY", "--word", "ANTHROPIC_API_KEY", "DEEPSEEK_API_KEY"]),
        (
            "flower",
            ["--address", "--port", "--app", "FLOWER_BASIC_AUTH", "/api/workers", "127.0.0.1", "5555"],
        ),
    ],
)
def test_every_command_has_a_help_a_newcomer_can_follow(command, expected):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0, result.output
    text = plain(result.output)
    assert "Traceback" not in text
    for word in expected:
        assert word.lower() in text.lower(), (command, word, text)


def test_help_examples_name_the_example_team_by_its_real_name():
    """Team names and mailbox ids in help texts are those of lattice_worker/examples/team.py (named ``demo``)."""
    from lattice_worker.examples.team import TEAM_NAME, team

    members = {m.name for m in team.members} | {"lead"}
    texts = {command: plain(runner.invoke(app, [command, "--help"]).output) for command in COMMANDS}
    assert f"e.g. {TEAM_NAME})" in texts["submit"]
    mailbox_ids = {
        (command, found) for command, text in texts.items() for found in re.findall(r"\b\w+::\w+\b", text)
    }
    assert ("inbox", f"{TEAM_NAME}::searcher") in mailbox_ids
    for command, mailbox_id in mailbox_ids:
        team_name, _, member = mailbox_id.partition("::")
        assert (team_name, member in members) == (TEAM_NAME, True), (command, mailbox_id)
    for command, text in texts.items():
        assert not re.search(r"e\.g\. example\b(?!s\.)", text), (command, text)
