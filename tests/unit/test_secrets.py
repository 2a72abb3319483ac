"""A URL's password never shows: reprs, settings errors, ``lattice`` error lines, connection
errors (password-bearing URLs to closed ports: nothing listens on port 1)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from lattice_client import AsyncLatticeClient, LatticeClient, get_settings
from lattice_client.cli import EXIT_ERROR, app
from lattice_client.runstore import RunStore
from lattice_mailbox import RedisMailbox, SQLMailbox, mailbox_from_url, mask_url
from lattice_mailbox.urls import redact_urls

SECRET = "s3cret-Pa55"
REDIS_DOWN = f"redis://:{SECRET}@127.0.0.1:1/0"
USER_REDIS_DOWN = f"redis://app:{SECRET}@127.0.0.1:1/3"
PG_DOWN = f"postgresql://app:{SECRET}@127.0.0.1:1/db"
runner = CliRunner()


def test_mask_url_hides_passwords_and_query_strings():
    assert mask_url(REDIS_DOWN) == "redis://:**@127.0.0.1:1/0"
    assert mask_url(USER_REDIS_DOWN) == "redis://app:**@127.0.0.1:1/3"
    assert mask_url(PG_DOWN) == "postgresql://app:**@127.0.0.1:1/db"
    assert SECRET not in mask_url(f"unix:///tmp/redis.sock?password={SECRET}")
    assert mask_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    text = redact_urls(f"cannot reach {REDIS_DOWN} nor '{PG_DOWN}'")
    assert SECRET not in text and "redis://:**@127.0.0.1:1/0" in text and "app:**@127.0.0.1:1/db" in text


def test_settings_repr_str_and_validation_errors_hide_the_password():
    settings = get_settings(broker_url=REDIS_DOWN, mailbox_url=PG_DOWN)
    for text in (repr(settings), str(settings)):
        assert SECRET not in text
        assert "redis://:**@127.0.0.1:1/0" in text and "postgresql://app:**@127.0.0.1:1/db" in text
    assert settings.broker_url == REDIS_DOWN  # the value itself is intact
    with pytest.raises(ValidationError) as caught:
        get_settings(broker_url=f"amqp://app:{SECRET}@127.0.0.1:1//")  # RabbitMQ without a mailbox Redis
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    assert "is RabbitMQ: mailbox_url must name the Redis" in str(caught.value)
    with pytest.raises(ValidationError) as caught:
        get_settings(broker_url=f"kafka://app:{SECRET}@127.0.0.1:1")
    assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    assert "broker_url must be a Redis or RabbitMQ URL" in str(caught.value)


def test_client_mailbox_and_run_store_reprs_hide_the_password():
    client = LatticeClient(REDIS_DOWN, mailbox_url=PG_DOWN)
    try:
        reprs = [repr(client), repr(client.aio), repr(client.settings), repr(client.aio.runs)]
    finally:
        client.close()
    reprs += [
        repr(AsyncLatticeClient(USER_REDIS_DOWN)),
        repr(RedisMailbox(REDIS_DOWN)),
        repr(SQLMailbox(PG_DOWN)),
        repr(mailbox_from_url(USER_REDIS_DOWN, prefix="p")),
        repr(RunStore(REDIS_DOWN, "p")),
    ]
    for text in reprs:
        assert SECRET not in text, text
    assert "redis://:**@127.0.0.1:1/0" in reprs[0]
    assert "postgresql+psycopg://app:**@127.0.0.1:1/db" in reprs[6]


def test_mailbox_url_errors_hide_the_password():
    with pytest.raises(ValueError) as caught:
        mailbox_from_url(f"mongodb://app:{SECRET}@127.0.0.1:1/db")
    assert SECRET not in str(caught.value) and "mongodb://app:**@127.0.0.1:1/db" in str(caught.value)


def test_connection_errors_of_the_client_hide_the_password():
    client = LatticeClient(REDIS_DOWN)
    try:
        for call in (
            lambda: client.wait("run-1", timeout=1),
            lambda: client.status(),
            lambda: client.cancel("r"),
        ):
            with pytest.raises(Exception) as caught:
                call()
            assert SECRET not in str(caught.value) and SECRET not in repr(caught.value)
    finally:
        client.close()

    async def pg() -> None:
        store = SQLMailbox(PG_DOWN)
        try:
            await store.inbox("demo::searcher")
        finally:
            await store.aclose()

    with pytest.raises(Exception) as caught:
        asyncio.run(pg())
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    "args",
    [
        ["--broker-url", REDIS_DOWN, "status"],
        ["--broker-url", USER_REDIS_DOWN, "submit", "demo", "hi"],
        ["--broker-url", REDIS_DOWN, "wait", "run-1"],
        ["--broker-url", REDIS_DOWN, "cancel", "run-1"],
        ["--broker-url", REDIS_DOWN, "events", "run-1"],
        ["--broker-url", REDIS_DOWN, "--mailbox-url", PG_DOWN, "inbox", "demo::searcher"],
        ["--broker-url", f"amqp://app:{SECRET}@127.0.0.1:1//", "status"],
        ["--broker-url", REDIS_DOWN, "--mailbox-url", f"mongodb://app:{SECRET}@h/db", "status"],
    ],
)
def test_lattice_error_lines_hide_the_password(args):
    for debug in ([], ["--debug"]):
        result = runner.invoke(app, [*debug, *args])
        assert result.exit_code == EXIT_ERROR, result.output
        assert "error:" in result.output
        assert SECRET not in result.output, result.output


@pytest.mark.timeout(120)
def test_lattice_worker_on_an_unreachable_redis_hides_the_password(tmp_path):
    """In its own process (a worker keeps per-process settings): a worker whose
    Redis does not answer keeps retrying (it waits for Redis, as Celery waits
    for its broker) and none of its output shows the URL's password."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LATTICE_")}
    for debug in ([], ["--debug"]):
        log = tmp_path / f"worker{len(debug)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from lattice_client.cli import app; app()", *debug]
                + ["--broker-url", REDIS_DOWN, "worker", "lattice_worker.examples.team:team"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=Path(__file__).resolve().parents[2],
                start_new_session=True,
            )
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and proc.poll() is None:
                    if "127.0.0.1:1" in log.read_text(errors="replace"):  # it said where it is trying
                        time.sleep(1.0)  # a retry or two more
                        break
                    time.sleep(0.2)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        text = log.read_text(errors="replace")
        assert "127.0.0.1:1" in text, text
        assert SECRET not in text, text
