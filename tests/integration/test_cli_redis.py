"""The ``lattice`` client commands against the real Redis (typer's CliRunner).

Each test uses its own ``test-<uuid>`` key prefix (``--key-prefix``) and deletes
every key under it afterwards. The tests play the worker's part through the
RunStore and the RedisMailbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from lattice_client.cli import EXIT_ERROR, EXIT_TIMEOUT, app
from lattice_client.models import RunResult
from lattice_client.runstore import RunStore
from lattice_mailbox import RedisMailbox
from tests.support.registry import publish_fake_worker
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


def register_teams(prefix: str, *names: str) -> None:
    """Write a live-registry entry as a running worker serving ``names`` does."""
    publish_fake_worker(prefix, {name: name for name in names})


@pytest.fixture
def prefix():
    """A fresh key prefix whose workers have registered the team ``example``."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    register_teams(name, "example")
    yield name
    sync = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(sync.scan_iter(match=f"{name}:*", count=1000))
        if keys:
            sync.delete(*keys)
    finally:
        sync.close()


def lattice(prefix: str, *args: str, columns: int = 200):
    result = runner.invoke(
        app, ["--broker-url", REDIS_URL, "--key-prefix", prefix, *args], env={"COLUMNS": str(columns)}
    )
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def in_store(prefix: str, fn) -> None:
    async def go() -> None:
        store = RunStore(REDIS_URL, prefix=prefix)
        try:
            await fn(store)
        finally:
            await store.aclose()

    asyncio.run(go())


def later(prefix: str, fn, delay: float = 0.3) -> threading.Thread:
    def main() -> None:
        time.sleep(delay)
        in_store(prefix, fn)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    return thread


def test_submit_prints_the_run_id_and_enqueues_the_lead_task(prefix):
    result = lattice(
        prefix, "submit", "example", "look for lease", "--run-id", "cli-run-1", "--metadata", '{"k": 1}'
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "cli-run-1"
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        [message] = [json.loads(m) for m in raw.lrange(f"{prefix}:{prefix}.example.lead", 0, -1)]
        assert message["headers"]["task"] == "lattice.run_lead"
        assert raw.hget(f"{prefix}:run:{{run:cli-run-1}}", "metadata") == '{"k":1}'
    finally:
        raw.close()
    again = lattice(prefix, "submit", "example", "again", "--run-id", "cli-run-1")
    assert again.exit_code == EXIT_ERROR
    assert "already exists" in again.output


@pytest.mark.parametrize(
    ("team", "expected"),
    [
        ("nosuchteam", "no live worker serves team 'nosuchteam'"),
        ("lattice_worker.examples.team", "needs ':attribute', e.g. 'lattice_worker.examples.team:team'"),
        (
            "lattice_worker.examples.team:TEAM_NAME",
            "unknown team reference 'lattice_worker.examples.team:TEAM_NAME'",
        ),
    ],
)
def test_submit_refuses_a_team_no_worker_registered_and_queues_nothing(prefix, team, expected):
    result = lattice(prefix, "submit", team, "hi")
    assert result.exit_code == EXIT_ERROR, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], result.output
    assert "--allow-unregistered" in errors[0]
    assert result.stdout.strip() == ""  # no run id printed
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        registry = sorted(raw.scan_iter(match=f"{prefix}:*"))
        assert registry == [
            f"{prefix}:worker:fake-worker@test",
            f"{prefix}:workers",
        ]  # nothing written, no task
    finally:
        raw.close()


def test_submit_allow_unregistered_queues_a_name_before_its_workers_start(prefix):
    result = lattice(prefix, "submit", "latecomer", "hi", "--run-id", "early-1", "--allow-unregistered")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "early-1"
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "no live worker serves team 'latecomer'" in warnings[0], result.stderr
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        assert raw.llen(f"{prefix}:{prefix}.latecomer.lead") == 1
        assert raw.hget(f"{prefix}:run:{{run:early-1}}", "team") == "latecomer"
    finally:
        raw.close()


def test_submit_never_imports_an_unregistered_reference_from_the_current_directory(
    prefix, tmp_path, monkeypatch
):
    module = f"lattice_cli_team_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "imported.marker"
    (tmp_path / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.chdir(tmp_path)
    for extra in ((), ("--allow-unregistered",)):
        result = lattice(prefix, "submit", f"{module}:team", "hi", "--run-id", "from-cwd", *extra)
        assert result.exit_code == EXIT_ERROR, result.output
        assert "never imports" in result.output
    assert not marker.exists()


def test_submit_wait_prints_the_result(prefix):
    def finish_when_submitted() -> None:
        async def go(store: RunStore) -> None:
            for _ in range(200):
                if await store.get("cli-run-2") is not None:
                    break
                await asyncio.sleep(0.02)
            await store.finish(
                "cli-run-2", RunResult(run_id="cli-run-2", status="completed", result="The answer is 42")
            )

        in_store(prefix, go)

    thread = threading.Thread(target=finish_when_submitted, daemon=True)
    thread.start()
    result = lattice(
        prefix, "submit", "example", "question", "--run-id", "cli-run-2", "--wait", "--timeout", "20"
    )
    thread.join(5)
    assert result.exit_code == 0, result.output
    assert "The answer is 42" in result.stdout
    assert "completed" in result.stdout


def test_wait_exit_codes_follow_the_run(prefix):
    lattice(prefix, "submit", "example", "q", "--run-id", "r-ok")
    lattice(prefix, "submit", "example", "q", "--run-id", "r-fail")
    lattice(prefix, "submit", "example", "q", "--run-id", "r-slow")

    async def finish(store: RunStore) -> None:
        await store.finish("r-ok", RunResult(run_id="r-ok", status="completed", result="fine"))
        await store.finish("r-fail", RunResult(run_id="r-fail", status="failed", error="member crashed"))

    later(prefix, finish, delay=0).join(10)
    ok = lattice(prefix, "wait", "r-ok", "--json")
    assert ok.exit_code == 0
    assert json.loads(ok.stdout)["result"] == "fine"
    failed = lattice(prefix, "wait", "r-fail")
    assert failed.exit_code == EXIT_ERROR
    assert "member crashed" in failed.stdout
    slow = lattice(prefix, "wait", "r-slow", "--timeout", "0.3")
    assert slow.exit_code == EXIT_TIMEOUT
    assert "did not finish within 0.3 s" in slow.output
    missing = lattice(prefix, "wait", "nope")
    assert missing.exit_code == EXIT_ERROR
    assert [line for line in missing.output.splitlines() if line.startswith("error:")] == [
        "error: run 'nope' not found"
    ]


def test_events_streams_json_lines_until_the_result(prefix):
    lattice(prefix, "submit", "example", "q", "--run-id", "r-ev")

    async def play(store: RunStore) -> None:
        await store.append_event("r-ev", {"type": "team_message", "subtype": "accepted"})
        await store.finish("r-ev", RunResult(run_id="r-ev", status="completed", result="done"))

    later(prefix, play, delay=0.2)
    result = lattice(prefix, "events", "r-ev", "--timeout", "20")
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert [e["type"] for e in events] == ["team_message", "run_result"]


def test_status_inbox_and_cancel(prefix):
    lattice(prefix, "submit", "example", "q", "--run-id", "r-c")
    ids: list[str] = []

    async def delegate(store: RunStore) -> None:
        mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
        try:
            for n in range(2):
                m = await mailbox.send(
                    "example::lead", "example::searcher", f"search part {n}", work_item_id=f"w{n}"
                )
                ids.append(m.id)
            await store.set_status("r-c", "running")
            items = [
                {
                    "work_item_id": f"w{n}",
                    "message_id": ids[n],
                    "mailbox_id": "example::searcher",
                    "member": "searcher",
                }
                for n in range(2)
            ]
            await store.add_items("r-c", items, max_active=2)
            await store.suspend("r-c")
        finally:
            await mailbox.aclose()

    in_store(prefix, delegate)
    status = lattice(prefix, "status", "example")
    assert status.exit_code == 0, status.output
    assert "example::searcher" in status.stdout and "r-c" in status.stdout and "suspended" in status.stdout
    as_json = json.loads(lattice(prefix, "status", "example", "--json").stdout)
    assert as_json["mailboxes"]["example::searcher"]["pending"] == 2
    inbox = lattice(prefix, "inbox", "example::searcher")
    assert inbox.exit_code == 0
    assert "search part 0" in inbox.stdout and "search part 1" in inbox.stdout
    cancel = lattice(prefix, "cancel", "r-c")
    assert cancel.exit_code == 0, cancel.output
    assert "2 message(s) cancelled" in cancel.stdout
    assert "no pending messages" in lattice(prefix, "inbox", "example::searcher").stdout
    cancelled = json.loads(
        lattice(prefix, "inbox", "example::searcher", "--status", "cancelled", "--json").stdout
    )
    assert sorted(m["id"] for m in cancelled) == sorted(ids)
    waited = lattice(prefix, "wait", "r-c")
    assert waited.exit_code == EXIT_ERROR and "cancelled" in waited.stdout
    again = lattice(prefix, "cancel", "r-c")  # idempotent
    assert again.exit_code == 0 and again.stdout.strip() == "run r-c already cancelled; nothing to cancel"
    missing = lattice(prefix, "cancel", "nope")
    assert missing.exit_code == EXIT_ERROR and "error: run 'nope' not found" in missing.output


def test_another_prefix_sees_nothing(prefix):
    lattice(prefix, "submit", "example", "q", "--run-id", "mine")
    other = f"{prefix}-x"
    try:
        result = lattice(other, "wait", "mine", "--timeout", "0")
        assert result.exit_code == EXIT_ERROR and "not found" in result.output
        assert "no runs yet" in lattice(other, "status").stdout
    finally:
        sync = redis.Redis.from_url(REDIS_URL)
        keys = list(sync.scan_iter(match=f"{other}:*"))
        if keys:
            sync.delete(*keys)
        sync.close()


def _header_cells(lines: list[str], title: str) -> list[str]:
    start = lines.index(title)
    return [c for c in re.split(r"\s{2,}", lines[start + 1].strip()) if c]


def _inbox_at_80(prefix: str, status: str, ids: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``lattice inbox example::searcher --status STATUS`` at 80 columns: its lines
    (none wider than 80) and ``{message id -> the words of its row}`` for ``ids``."""
    inbox = lattice(prefix, "inbox", "example::searcher", "--status", status, columns=80)
    assert inbox.exit_code == 0, inbox.output
    lines = [line.rstrip() for line in inbox.stdout.splitlines()]
    assert max(len(line) for line in lines) <= 80, inbox.stdout
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in ids}
    return lines, rows


def test_status_and_inbox_tables_are_readable_at_80_columns(prefix):
    """80 columns is also what rich assumes when output is not a terminal (pipes, CI)."""
    lattice(prefix, "submit", "example", "q", "--run-id", "narrow-queued")
    lattice(prefix, "submit", "example", "q", "--run-id", "narrow-done")
    ids: list[str] = []

    async def play(store: RunStore) -> None:
        await store.finish(
            "narrow-done",
            RunResult(run_id="narrow-done", status="completed", result="The word claim occurs 42 times"),
        )
        mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
        try:
            for n in range(2):
                m = await mailbox.send("example::lead", "example::searcher", f"search part {n} of the corpus")
                ids.append(m.id)
            claimed = await mailbox.claim_next("example::searcher")
            assert claimed is not None and claimed.id == ids[0]
        finally:
            await mailbox.aclose()

    in_store(prefix, play)
    status = lattice(prefix, "status", "example", columns=80)
    assert status.exit_code == 0, status.output
    lines = [line.rstrip() for line in status.stdout.splitlines()]
    assert max(len(line) for line in lines) <= 80, status.stdout
    assert _header_cells(lines, "mailboxes of example") == [
        "mailbox", "pending", "processing", "done", "failed", "cancelled", "read", "parked",
    ]  # fmt: skip
    assert _header_cells(lines, "recent runs") == ["run id", "team", "status", "created", "result"]
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("narrow-", "example::"))}
    assert rows["example::searcher"][1:3] == ["1", "1"]
    assert rows["narrow-queued"][1:3] == ["example", "queued"]
    assert rows["narrow-done"][1:3] == ["example", "completed"]
    assert "The word" in " ".join(rows["narrow-done"][3:])
    lines, rows = _inbox_at_80(prefix, "all", ids)
    assert _header_cells(lines, "example::searcher (all)") == ["id", "status", "attempts", "content"]
    assert rows[ids[0]][1:3] == ["processing", "1"]
    assert rows[ids[1]][1:3] == ["pending", "0"]
    [note] = [line for line in lines if line.startswith("(hidden at this width:")]
    assert sorted(note.split(": ", 1)[1].split(";")[0].split(", ")) == ["created", "from"]


def test_inbox_status_all_shows_the_status_column_at_80_columns_when_every_message_has_one(prefix):
    """``--status all`` does not name a status in the title: the column stays even when every
    message listed is pending (it used to be dropped first at 80 columns)."""
    ids: list[str] = []

    async def play(store: RunStore) -> None:
        mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
        try:
            for n in range(2):
                ids.append((await mailbox.send("example::lead", "example::searcher", f"part {n}")).id)
        finally:
            await mailbox.aclose()

    in_store(prefix, play)
    lines, rows = _inbox_at_80(prefix, "all", ids)
    assert _header_cells(lines, "example::searcher (all)") == ["id", "status", "attempts", "content"]
    assert [rows[i][1] for i in ids] == ["pending", "pending"]
    # one status asked for: the title names it, so the column is the first to go
    lines, _ = _inbox_at_80(prefix, "pending", ids)
    assert _header_cells(lines, "example::searcher (pending)")[:2] == ["id", "attempts"]


_COMMANDS_IN_ONE_PROCESS = """
import json, sys
from typer.testing import CliRunner
from lattice_client.cli import app
base = ["--broker-url", sys.argv[1], "--key-prefix", sys.argv[2], "status", "example"]
widths = {}
for columns in ("60", "200", "60"):
    shown = CliRunner().invoke(app, base, env={"COLUMNS": columns})
    assert shown.exit_code == 0, shown.output
    widths.setdefault(columns, []).append(max(len(line.rstrip()) for line in shown.stdout.splitlines()))
print(json.dumps(widths))
"""


def test_each_command_in_one_process_fits_its_own_columns(prefix):
    """One process running many commands (CliRunner, a service embedding the CLI),
    imported while COLUMNS said 40 (pytest-xdist's workers export COLUMNS=80): each
    command fits the COLUMNS it runs with, not the width at import."""
    lattice(
        prefix, "submit", "example", "a question whose text is long enough to be cut " * 3, "--run-id", "wide"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LATTICE_")}
    done = subprocess.run(
        [sys.executable, "-c", _COMMANDS_IN_ONE_PROCESS, REDIS_URL, prefix],
        env={**env, "COLUMNS": "40"}, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    widths = json.loads(done.stdout.splitlines()[-1])
    assert all(w <= 60 for w in widths["60"]) and widths["200"][0] > 70, widths  # not cut to 40 or 60
