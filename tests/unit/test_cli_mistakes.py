"""Mistakes the ``lattice`` command catches before anything is sent (typer's CliRunner,
no services: Redis is *not* reachable on the ports used here).

Each test checks the exit code and the key words of the one-line message.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from lattice_client.cli import EXIT_ERROR, app
from lattice_client.settings import setting_variables, unknown_variables

runner = CliRunner()
DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1
ROOT = Path(__file__).resolve().parents[2]
COMMANDS = sorted(typer.main.get_command(app).commands)


def run(*args: str, env: dict[str, str] | None = None, input: str | bytes | None = None):
    result = runner.invoke(app, list(args), env=env, input=input)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


# -- help the way a person types it ------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_flags_and_arguments_as_typed(command):
    result = run(command, "--help", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert not re.search(r"<(bool|str|int|float|text|integer)>", text), text
    assert not re.search(r"\{[a-z_]+\}", text), text
    usage = text.splitlines()[0]
    assert re.fullmatch(rf"Usage: \S+ {command} \[OPTIONS\]( \[?[A-Z_]+\]?)*", usage), usage
    assert re.search(r"^\s+--help\s+Show this message and exit\.", text, re.M)


def test_submit_help_reads_as_typed():
    text = run("submit", "--help", env={"COLUMNS": "200"}).output
    assert text.splitlines()[0].endswith("submit [OPTIONS] TEAM PROMPT")
    assert re.search(r"^\s+-w, --wait\s+Wait for the final result", text, re.M)
    assert re.search(r"^\s+-t, --timeout SECONDS\s+With --wait", text, re.M)
    assert re.search(r"^\s+--metadata JSON\s+", text, re.M)
    assert "'-' reads it from stdin, '@FILE' from a file" in " ".join(text.split())
    top = run("--help", env={"COLUMNS": "200"}).output
    assert re.search(r"^\s+--key-prefix PREFIX\s+", top, re.M)
    assert re.search(r"^\s+--debug\s+On an error", top, re.M)
    assert "[bold]" not in top


def test_status_help_marks_the_optional_argument():
    assert run("status", "--help").output.splitlines()[0].endswith("status [OPTIONS] [TEAM]")


# -- a global option after the command ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["status", "--key-prefix", "staging"], "lattice --key-prefix staging status ..."),
        (["wait", "run-1", "--broker-url=redis://h:1/0"], "lattice --broker-url redis://h:1/0 wait ..."),
        (["inbox", "demo::searcher", "--debug"], "lattice --debug inbox ..."),
        (
            ["worker", "x:y", "--key-prefix", "p"],
            "lattice --key-prefix p worker ...",
        ),  # passes options through
        (["flower", "--mailbox-url", "redis://h/1"], "lattice --mailbox-url redis://h/1 flower ..."),
    ],
)
def test_a_global_option_after_the_command_gets_a_hint(args, hint):
    result = run(*args)
    assert result.exit_code == 2, result.output
    line = error_line(result)
    name = hint.split()[1]
    assert f"{name} is an option of lattice itself: put {name} before the command" in line
    assert line.endswith(f"e.g. {hint}"), line


def test_the_hint_masks_a_password():
    result = run("status", "--broker-url", "redis://:s3cret@h:1/0")
    assert result.exit_code == 2
    assert "s3cret" not in result.output
    assert "lattice --broker-url redis://:**@h:1/0 status" in error_line(result)


def test_an_option_value_that_looks_like_a_global_option_after_double_dash_is_left_alone(monkeypatch):
    calls: list = []
    module = type(sys)("lattice_worker.runtime.worker.main")
    module.run_worker = lambda *args: calls.append(args)
    monkeypatch.setitem(sys.modules, "lattice_worker.runtime.worker.main", module)
    assert run("worker", "x:y", "--", "--key-prefix").exit_code == 0
    assert calls and calls[0][3] == ["--key-prefix"]  # after "--": for Celery, as the user wrote


# -- option combinations that do nothing -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["submit", "demo", "hi", "--timeout", "5"], "--timeout applies to --wait"),
        (
            ["worker", "x:y", "--concurrency", "4", "--pool", "solo"],
            "--concurrency does nothing with --pool solo",
        ),
        (["worker", "x:y", "-c", "2", "-P=solo"], "--concurrency does nothing with --pool solo"),
        (
            ["worker", "x:y", "--pool", "gevent"],
            "--pool gevent: not a pool lattice workers run on; use one of asyncio",
        ),
        (["flower"], "Flower needs credentials: --basic-auth USER:PASSWORD"),
        (["flower", "--unauthenticated", "--address", "0.0.0.0"], "loopback address only, not '0.0.0.0'"),
        (["flower", "--unauthenticated", "--basic-auth", "ops:pw"], "exclude each other"),
        (["flower", "--basic-auth", "ops"], "must be USER:PASSWORD"),
        (["flower", "--basic-auth", "ops:"], "an empty password"),
        (["flower", "--auth", ".*@example\\.com"], "FLOWER_OAUTH2_KEY, FLOWER_OAUTH2_SECRET"),
    ],
)
def test_combinations_that_do_nothing_are_refused(args, words):
    result = run("--broker-url", DOWN, *args)
    assert result.exit_code == EXIT_ERROR, result.output
    assert words in error_line(result)


def test_flower_credentials_from_the_environment_count(monkeypatch):
    result = run("flower", "--unauthenticated", env={"FLOWER_BASIC_AUTH": "ops:pw"})
    assert result.exit_code == EXIT_ERROR
    assert "exclude each other" in error_line(result)
    assert "pw" not in result.output.replace("password", "")


# -- prompts from stdin and files --------------------------------------------------------------


def test_a_prompt_over_the_bound_from_stdin_is_refused_naming_the_variable():
    result = run(
        "--broker-url", DOWN, "submit", "demo", "-", env={"LATTICE_MAX_MESSAGE_BYTES": "100"}, input="x" * 101
    )
    assert result.exit_code == EXIT_ERROR
    line = error_line(result)
    assert "read from stdin is over the message bound of 100 bytes (LATTICE_MAX_MESSAGE_BYTES)" in line


def test_a_prompt_file_over_the_bound_or_missing_is_refused(tmp_path):
    big = tmp_path / "prompt.txt"
    big.write_text("y" * 101)
    result = run("--broker-url", DOWN, "submit", "demo", f"@{big}", env={"LATTICE_MAX_MESSAGE_BYTES": "100"})
    assert result.exit_code == EXIT_ERROR
    assert "over the message bound of 100 bytes (LATTICE_MAX_MESSAGE_BYTES)" in error_line(result)
    missing = run("--broker-url", DOWN, "submit", "demo", f"@{tmp_path / 'nope.txt'}")
    assert missing.exit_code == EXIT_ERROR
    line = error_line(missing)
    assert "cannot read the prompt file" in line and "No such file" in line and "@@" in line


def test_a_prompt_that_is_not_utf8_is_refused():
    result = run("--broker-url", DOWN, "submit", "demo", "-", input=b"\xff\xfe bad")
    assert result.exit_code == EXIT_ERROR
    assert "read from stdin is not UTF-8 text" in error_line(result)


# -- unknown LATTICE_* variables ---------------------------------------------------------------


def test_an_unknown_lattice_variable_is_warned_about_with_the_closest_name():
    result = run("--broker-url", DOWN, "status", env={"LATTICE_BROKR_URL": "redis://x/0"})
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: LATTICE_BROKR_URL is not a lattice setting and is ignored (did you mean LATTICE_BROKER_URL?)"
    ]
    assert unknown_variables({"LATTICE_ZZZZZZZZZZZZ": "1", "LATTICE_KEY_PREFIX": "x", "OTHER": "y"}) == [
        ("LATTICE_ZZZZZZZZZZZZ", None)
    ]


def test_every_lattice_variable_the_product_reads_is_known_to_the_settings():
    """A variable named in the product's code, the compose file or the README's tables and
    missing from the settings' list would be warned about as a typo."""
    texts = [
        p.read_text(errors="replace") for p in [*ROOT.glob("lattice_*/**/*.py"), *ROOT.glob("compose/*")]
    ]
    readme = (ROOT / "README.md").read_text()
    texts.append("\n".join(line for line in readme.splitlines() if line.startswith("|")))  # its tables
    named = set()
    for text in texts:
        named |= set(re.findall(r"\bLATTICE_[A-Z][A-Z_]*[A-Z]\b", text))
    known = setting_variables()
    assert named - known == set(), sorted(named - known)
    assert {"LATTICE_BROKER_URL", "LATTICE_REDIS_PORT", "LATTICE_TEST_REDIS_URL", "LATTICE_DEBUG"} <= known


# -- errors in a team module -------------------------------------------------------------------


@pytest.fixture
def broken_team_module(tmp_path, monkeypatch):
    """A module ``lattice_broken_team`` in a temporary directory that raises when imported."""
    (tmp_path / "lattice_broken_team.py").write_text("import os\n\nVALUE = 1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "lattice_broken_team", raising=False)
    return tmp_path / "lattice_broken_team.py"


def test_an_error_in_a_team_module_names_the_module_file_and_line(broken_team_module):
    result = run("--broker-url", DOWN, "drain", "lattice_broken_team:team")
    assert result.exit_code == EXIT_ERROR, result.output
    line = error_line(result)
    assert "error in team module 'lattice_broken_team'" in line
    assert f"{broken_team_module}, line 3" in line
    assert "ZeroDivisionError: division by zero" in line
    assert line.endswith("(--debug shows the traceback)")
    assert "Traceback" not in result.output


@pytest.mark.parametrize("how", ["--debug", "LATTICE_DEBUG=1"])
def test_debug_shows_the_traceback_of_the_team_module(broken_team_module, how):
    args = ["--debug"] if how == "--debug" else []
    env = {"LATTICE_DEBUG": "1"} if how != "--debug" else None
    result = runner.invoke(app, [*args, "--broker-url", DOWN, "drain", "lattice_broken_team:team"], env=env)
    assert result.exit_code == EXIT_ERROR, result.output
    assert "Traceback (most recent call last)" in result.output
    assert f'File "{broken_team_module}", line 3' in result.output
    assert "VALUE = 1 / 0" in result.output
    assert "error in team module 'lattice_broken_team'" in error_line(result)
