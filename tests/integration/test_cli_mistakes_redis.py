"""Mistakes the ``lattice`` command catches against the real Redis: unknown team names and
mailbox ids, ``--broker-url`` alone, prompts from stdin and files, Ctrl-C while waiting,
drain output without a terminal.

Each test uses its own key prefix (the ``prefix`` fixture) whose keys are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from lattice_client.cli import EXIT_ERROR, app
from lattice_client.runstore import RunStore
from lattice_mailbox import RedisMailbox
from tests.support.registry import publish_fake_worker
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

runner = CliRunner()
DOWN = "redis://127.0.0.1:1/0"


def lattice(prefix: str, *args: str, env: dict[str, str] | None = None, input: str | None = None):
    result = runner.invoke(
        app, ["--broker-url", REDIS_URL, "--key-prefix", prefix, *args], env=env, input=input
    )
    assert "Traceback" not in result.output, result.output
    return result


def error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


def send(prefix: str, to: str, content: str = "task") -> str:
    async def main() -> str:
        mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
        try:
            return (await mailbox.send("demo::lead", to, content)).id
        finally:
            await mailbox.aclose()

    return asyncio.run(main())


def register(prefix: str, *names: str) -> None:
    publish_fake_worker(prefix, {name: name for name in names})


def test_an_unknown_team_is_refused_with_the_known_ones(prefix):
    register(prefix, "demo")
    send(prefix, "research::searcher")
    result = lattice(prefix, "status", "dmeo")
    assert result.exit_code == EXIT_ERROR, result.output
    line = error_line(result)
    assert "unknown team 'dmeo'" in line and f"key prefix {prefix!r}" in line
    assert "known teams: demo, research (did you mean demo?)" in line
    dotted = error_line(lattice(prefix, "status", "pkg.demo"))  # a reference without its attribute
    assert "unknown team 'pkg.demo' (a reference needs ':attribute', e.g. 'pkg.demo:team')" in dotted
    # a registered team with no mailbox yet, and a team with mailboxes, are fine
    assert lattice(prefix, "status", "demo").exit_code == 0
    assert lattice(prefix, "status", "research").exit_code == 0


@pytest.mark.parametrize("command", ["parked", "approvals"])
def test_the_waiting_calls_of_an_unknown_team_are_refused_not_listed_as_none(prefix, command):
    register(prefix, "demo")
    result = lattice(prefix, command, "dmeo")
    assert result.exit_code == EXIT_ERROR, result.output
    assert "unknown team 'dmeo'" in error_line(result) and "(did you mean demo?)" in error_line(result)
    known = lattice(prefix, command, "demo")  # a known team with nothing waiting
    assert known.exit_code == 0 and known.output.startswith("no ") and "for team 'demo'" in known.output


def test_an_unknown_team_in_an_empty_deployment_says_none_is_known(prefix):
    result = lattice(prefix, "status", "demo")
    assert result.exit_code == EXIT_ERROR
    assert error_line(result).endswith("no known teams yet")


def test_an_unknown_mailbox_is_refused_with_the_known_ones(prefix):
    send(prefix, "demo::searcher", "find claim")
    send(prefix, "demo::counter")
    result = lattice(prefix, "inbox", "demo::serch")
    assert result.exit_code == EXIT_ERROR, result.output
    line = error_line(result)
    assert "unknown mailbox 'demo::serch': no message was ever sent to it" in line
    assert "known mailboxes: demo::counter, demo::searcher (did you mean demo::searcher?)" in line
    # a member name nothing like the known ones gets no suggestion (the shared team name is not closeness)
    assert error_line(lattice(prefix, "inbox", "demo::typo")).endswith(
        "known mailboxes: demo::counter, demo::searcher"
    )
    assert "(did you mean demo::searcher?)" in error_line(lattice(prefix, "inbox", "dmeo::searcher"))
    bad = lattice(prefix, "inbox", "searcher")
    assert bad.exit_code == EXIT_ERROR and "expected '<team>::<member>'" in error_line(bad)
    ok = lattice(prefix, "inbox", "demo::searcher")
    assert ok.exit_code == 0 and "find claim" in ok.stdout


def test_a_member_of_a_served_team_is_known_before_its_first_message(prefix):
    """Right after the workers start no message went anywhere yet: the live
    registry's member mailboxes are the known ones (a typo gets a suggestion)."""
    publish_fake_worker(prefix, {"acc": "acc"}, mailboxes=["acc::researcher", "acc::writer"])
    line = error_line(lattice(prefix, "inbox", "acc::reseacher"))
    assert "unknown mailbox 'acc::reseacher'" in line
    assert line.endswith("known mailboxes: acc::researcher, acc::writer (did you mean acc::researcher?)")
    ok = lattice(prefix, "inbox", "acc::researcher")
    assert ok.exit_code == 0 and ok.stdout.strip() == "no pending messages in acc::researcher"


def test_broker_url_alone_also_moves_the_mailboxes(prefix):
    send(prefix, "demo::searcher", "in the broker's Redis")
    env = {"LATTICE_MAILBOX_URL": DOWN, "COLUMNS": "200"}  # exported elsewhere: --broker-url alone must win
    result = lattice(prefix, "inbox", "demo::searcher", env=env)
    assert result.exit_code == 0, result.output
    assert "in the broker's Redis" in result.stdout
    assert "note: --broker-url also moves the mailboxes there" in result.output
    # --mailbox-url given too: the mailboxes stay apart
    apart = runner.invoke(
        app,
        ["--broker-url", REDIS_URL, "--mailbox-url", DOWN, "--key-prefix", prefix, "inbox", "demo::searcher"],
    )
    assert apart.exit_code == EXIT_ERROR and "cannot reach Redis" in error_line(apart)


def _record(prefix: str, run_id: str):
    async def main():
        store = RunStore(REDIS_URL, prefix)
        try:
            return await store.get(run_id)
        finally:
            await store.aclose()

    return asyncio.run(main())


def _prompt_of(prefix: str, run_id: str) -> str:
    record = _record(prefix, run_id)
    assert record is not None
    return record.prompt


def _status(prefix: str, run_id: str) -> str | None:
    record = _record(prefix, run_id)
    return record.status.value if record is not None else None


def test_a_prompt_from_stdin_a_file_or_a_literal_at(prefix, tmp_path):
    text = "Look through ./docs\nfor the word lease ✓\n" * 50
    piped = lattice(
        prefix, "submit", "demo", "-", "--allow-unregistered", "--run-id", "from-stdin", input=text
    )
    assert piped.exit_code == 0, piped.output
    assert _prompt_of(prefix, "from-stdin") == text
    path = tmp_path / "prompt.txt"
    path.write_text("from a file")
    filed = lattice(prefix, "submit", "demo", f"@{path}", "--allow-unregistered", "--run-id", "from-file")
    assert filed.exit_code == 0, filed.output
    assert _prompt_of(prefix, "from-file") == "from a file"
    literal = lattice(prefix, "submit", "demo", "@@alice, hello", "--allow-unregistered", "--run-id", "at")
    assert literal.exit_code == 0
    assert _prompt_of(prefix, "at") == "@alice, hello"


def test_a_prompt_up_to_the_bound_is_accepted_and_one_byte_more_refused(prefix):
    env = {"LATTICE_MAX_MESSAGE_BYTES": "1000"}
    ok = lattice(
        prefix, "submit", "demo", "-", "--allow-unregistered", "--run-id", "r1", env=env, input="é" * 500
    )
    assert ok.exit_code == 0, ok.output
    over = lattice(prefix, "submit", "demo", "-", "--allow-unregistered", env=env, input="é" * 500 + "x")
    assert over.exit_code == EXIT_ERROR
    assert "(LATTICE_MAX_MESSAGE_BYTES)" in error_line(over)


# Ctrl-C at a terminal: SIGINT raises KeyboardInterrupt even when the suite itself
# runs with SIGINT ignored (a background job of a non-interactive shell, nohup),
# which the CLI would inherit and then never see the signal
CTRL_C_CLI = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from lattice_client.cli import app; app()"
)


def test_ctrl_c_during_wait_says_the_run_continues_and_how_to_follow_it(prefix, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LATTICE_")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CTRL_C_CLI,
            "--broker-url",
            REDIS_URL,
            "--key-prefix",
            prefix,
            "submit",
            "demo",
            "hello",
            "--allow-unregistered",
            "--run-id",
            "waited-on",
            "--wait",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while _status(prefix, "waited-on") is None:  # submitted: now it waits (no worker serves "demo")
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    assert "interrupted: run waited-on continues on the workers." in err
    base = f"lattice --broker-url {REDIS_URL} --key-prefix {prefix}"
    assert f"wait for it with: {base} wait waited-on" in err
    assert f"cancel it with: {base} cancel waited-on" in err
    assert "Traceback" not in err
    assert _status(prefix, "waited-on") == "queued"  # nothing was cancelled


def test_drain_progress_reads_cleanly_without_a_terminal(prefix):
    task = send(prefix, "e2e::worker", "a task for the e2e team's worker member")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LATTICE_")}
    env.update({"LATTICE_BROKER_URL": REDIS_URL, "LATTICE_KEY_PREFIX": prefix, "COLUMNS": "100"})
    env.update({"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"})  # as CI systems set them: still a pipe
    done = subprocess.run(
        [sys.executable, "-c", "from lattice_client.cli import app; app()", "drain", "tests.e2e.teams:team"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,
    )
    assert done.returncode == 0, done.stderr
    for code in ("\r", "\x1b[2K", "\x1b[?25"):  # carriage returns, line erases, cursor hiding
        assert code not in done.stdout, repr(done.stdout)
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in done.stdout.splitlines()]  # colours are fine
    assert any(line.strip().startswith(f"e2e::worker  {task}  -> ") for line in lines), lines
    assert lines[-1].startswith("drained 1 message(s)"), lines


def test_a_reference_submitted_with_no_live_worker_is_refused_without_importing_it(
    prefix, tmp_path, monkeypatch
):
    """The client never imports a team's module: a broken module named by a
    reference no live worker serves is refused, and its code never runs."""
    (tmp_path / "lattice_broken_submit.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\nraise RuntimeError('config missing')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lattice_broken_submit", raising=False)
    result = lattice(prefix, "submit", "lattice_broken_submit:team", "hi")
    assert result.exit_code == EXIT_ERROR, result.output
    line = error_line(result)
    assert "lattice_broken_submit:team" in line and "no live worker" in line, line
    assert "lattice_broken_submit" not in sys.modules
    assert not (tmp_path / "imported").exists()


def test_status_of_a_team_lists_its_queues_no_live_worker_consumes_with_0_workers(prefix):
    # a worker serves the team's scout only: its lead queue and the searcher's have nobody
    publish_fake_worker(prefix, {"demo": "demo"}, node="scout-only@test", queues=[f"{prefix}.demo.scout"])
    send(prefix, "demo::searcher")
    result = lattice(prefix, "status", "demo", env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = {
        line.split()[0]: line.split()[1] for line in result.stdout.splitlines() if line.startswith(prefix)
    }
    assert rows == {f"{prefix}.demo.lead": "0", f"{prefix}.demo.scout": "1", f"{prefix}.demo.searcher": "0"}
