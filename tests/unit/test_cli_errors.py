"""Bad input to the ``lattice`` command: one ``error:`` line, a non-zero exit code,
never a traceback (typer's CliRunner; Redis is *not* reachable on the ports used here)."""

from __future__ import annotations

import os
import sys
import types

import pytest
from typer.testing import CliRunner

from lattice_client.cli import EXIT_ERROR, app, flower_argv

runner = CliRunner()
DOWN = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def run(*args: str, env: dict[str, str] | None = None):
    result = runner.invoke(app, list(args), env=env)
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--broker-url", DOWN, "status"], "cannot reach Redis"),
        (["--broker-url", DOWN, "wait", "run-1"], "cannot reach Redis"),
        (["--broker-url", DOWN, "submit", "example", "hi"], "cannot reach Redis"),
        (["--broker-url", DOWN, "cancel", "run-1"], "cannot reach Redis"),
        (["--broker-url", DOWN, "inbox", "example::searcher"], "cannot reach Redis"),
        (["--broker-url", DOWN, "events", "run-1"], "cannot reach Redis"),
        (["inbox", "example::searcher", "--status", "bogus"], "unknown status 'bogus'"),
        (["--key-prefix", "bad prefix", "status"], "key_prefix (LATTICE_KEY_PREFIX or --key-prefix): "),
        (["--broker-url", "kafka://x", "status"], "broker_url must be a Redis or RabbitMQ URL"),
        (["--broker-url", "amqp://x", "status"], "is RabbitMQ: mailbox_url must name the Redis"),
        (
            ["--broker-url", "amqp://x", "--mailbox-url", "sqlite:///x.db", "status"],
            "mailbox_url, which must then be a Redis URL",
        ),
        (["--broker-url", DOWN, "wait", "bad/id"], "invalid run id"),
        (
            ["--broker-url", DOWN, "submit", "example", "hi", "--metadata", "{oops"],
            "--metadata is not valid JSON",
        ),
        (
            ["--broker-url", DOWN, "submit", "example", "hi", "--metadata", "[1]"],
            "--metadata must be a JSON object",
        ),
        (
            ["--broker-url", DOWN, "submit", "example", "hi", "--wait", "--timeout", "-1"],
            "--timeout must be >= 0",
        ),
        (
            ["--broker-url", DOWN, "submit", "example", "hi", "--wait", "--timeout", "nan"],
            "--timeout must be >= 0 seconds (or inf: no limit), got nan",
        ),
        (["--broker-url", DOWN, "submit", "example", "  "], "prompt must be a non-empty string"),
        (["demo", "/definitely/not/a/dir"], "not a directory"),
        (["--key-prefix", "bad prefix", "worker", "lattice_worker.examples.team:team"], "key_prefix"),
        (
            ["worker", "lattice_worker.examples.team"],
            "a reference needs ':attribute', e.g. 'lattice_worker.examples.team:team'",
        ),
        (
            ["flower", "--unauthenticated", "--app", "no_such_module_for_flower:app"],
            "cannot find the Celery app module",
        ),
    ],
)
def test_bad_input_prints_one_error_line_and_exits_non_zero(args, message):
    result = run(*args)
    assert result.exit_code == EXIT_ERROR, result.output
    lines = error_lines(result)
    assert len(lines) == 1, result.output
    assert message in lines[0], lines


def test_environment_variables_configure_the_cli():
    result = run("status", env={"LATTICE_BROKER_URL": DOWN})
    assert result.exit_code == EXIT_ERROR
    assert "127.0.0.1:1" in error_lines(result)[0]


def test_an_unreachable_sql_mailbox_is_one_error_line_naming_its_setting_without_the_password():
    url = "postgresql://postgres:s3cret@127.0.0.1:1/test"
    result = run("--broker-url", DOWN, "--mailbox-url", url, "inbox", "demo::x")
    assert result.exit_code == EXIT_ERROR
    [line] = error_lines(result)
    assert line.startswith("error: mailbox database error (LATTICE_MAILBOX_URL or --mailbox-url): connection")
    assert "sqlalche.me" not in line and "s3cret" not in result.output


def test_a_bad_setting_from_the_environment_names_its_variable():
    result = run("status", env={"LATTICE_MAX_RUN_EVENTS": "5"})
    assert result.exit_code == EXIT_ERROR
    [line] = error_lines(result)
    assert "max_run_events (LATTICE_MAX_RUN_EVENTS): Input should be greater than or equal to 10" in line


def test_a_bad_field_inside_a_json_setting_names_the_variable_that_holds_it():
    result = run("status", env={"LATTICE_MODEL_LIMITS": '{"*": {"requests_per_minte": 2}}'})
    assert result.exit_code == EXIT_ERROR
    [line] = error_lines(result)
    # the field is named where it is in the JSON; the variable is LATTICE_MODEL_LIMITS, not
    # a LATTICE_MODEL_LIMITS.*.REQUESTS_PER_MINTE that does not exist
    assert "model_limits.*.requests_per_minte (LATTICE_MODEL_LIMITS): Extra inputs are not permitted" in line


def test_usage_errors_exit_2_without_traceback():
    assert run("submit").exit_code == 2
    assert run("flower", "--port", "0").exit_code == 2
    assert run("status", "--limit", "0").exit_code == 2
    assert run("no-such-command").exit_code == 2


# -- worker-side wrappers: the seam (team_ref, members, concurrency, extra_args) -------------------


def fake_worker_module(monkeypatch, name: str, function: str, calls: list) -> None:
    """Stand in for a worker-side module so the wrapper's hand-over can be observed."""
    module = types.ModuleType(name)

    def record(*args):
        calls.append(args)

    setattr(module, function, record)
    monkeypatch.setitem(sys.modules, name, module)


def test_worker_passes_team_members_concurrency_and_celery_args_through(monkeypatch):
    calls: list = []
    fake_worker_module(monkeypatch, "lattice_worker.runtime.worker.main", "run_worker", calls)
    monkeypatch.setenv("LATTICE_KEY_PREFIX", "before")  # restored after the test
    result = run(
        "--key-prefix",
        "dep7",
        "worker",
        "lattice_worker.examples.team:team",
        "--member",
        "searcher",
        "-m",
        "lead",
        "--concurrency",
        "4",
        "--loglevel",
        "INFO",
        "-O",
        "fair",
    )
    assert result.exit_code == 0, result.output
    assert calls == [
        ("lattice_worker.examples.team:team", ["searcher", "lead"], 4, ["--loglevel", "INFO", "-O", "fair"])
    ]
    assert os.environ["LATTICE_KEY_PREFIX"] == "dep7"  # the worker side reads the same settings


def test_exported_settings_do_not_leak_between_tests():
    assert os.environ.get("LATTICE_KEY_PREFIX") != "dep7"


def test_worker_defaults_to_every_queue(monkeypatch):
    calls: list = []
    fake_worker_module(monkeypatch, "lattice_worker.runtime.worker.main", "run_worker", calls)
    assert run("worker", "lattice_worker.examples.team:team").exit_code == 0
    assert calls == [("lattice_worker.examples.team:team", [], None, [])]


def test_drain_and_demo_hand_over_their_arguments(monkeypatch, tmp_path):
    drains: list = []
    demos: list = []
    fake_worker_module(monkeypatch, "lattice_worker.runtime.worker.drain", "run_drain", drains)
    fake_worker_module(monkeypatch, "lattice_worker.demo", "run_demo", demos)
    assert (
        run(
            "drain",
            "lattice_worker.examples.team:team",
            "-m",
            "searcher",
            "--max-rounds",
            "3",
            "--max-messages",
            "7",
        ).exit_code
        == 0
    )
    assert [c[:4] for c in drains] == [("lattice_worker.examples.team:team", ["searcher"], 3, 7)]
    assert hasattr(drains[0][4], "print")  # a rich console for the progress display
    assert run("demo", str(tmp_path), "--word", "lease").exit_code == 0
    assert [c[:2] for c in demos] == [(str(tmp_path), "lease")]


def test_missing_worker_side_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "lattice_worker.runtime.worker.main", None)  # import fails
    result = run("worker", "lattice_worker.examples.team:team")
    assert result.exit_code == EXIT_ERROR
    assert "the worker side is not available" in error_lines(result)[0]
    assert error_lines(result)[0].endswith(
        "install it with pip install 'agent-lattice[worker]'"
    )  # not markup


def test_worker_side_errors_become_one_line(monkeypatch):
    module = types.ModuleType("lattice_worker.runtime.worker.main")

    def run_worker(*args):
        raise ValueError("team reference 'x:y' cannot be loaded:\nNo module named 'x'")

    module.run_worker = run_worker
    monkeypatch.setitem(sys.modules, "lattice_worker.runtime.worker.main", module)
    result = run("worker", "x:y")
    assert result.exit_code == EXIT_ERROR
    assert error_lines(result) == ["error: team reference 'x:y' cannot be loaded: No module named 'x'"]


def test_flower_argv_passes_flower_options_through():
    argv = flower_argv("0.0.0.0", 5555, ["--basic-auth=u:p", "--url-prefix=flower"])
    assert argv == [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "lattice_worker.runtime.worker.celery_app:app",
        "flower",
        "--address=0.0.0.0",
        "--port=5555",
        "--basic-auth=u:p",
        "--url-prefix=flower",
    ]
