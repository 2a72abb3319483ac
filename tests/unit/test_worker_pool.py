"""``lattice worker``'s pool defaults, the task loops (per thread), the registry's refusal."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from lattice_mailbox.memory import MemoryMailbox
from lattice_worker.runtime.worker import loops
from lattice_worker.runtime.worker.aio_pool import POOL_PATH, AsyncioPool
from lattice_worker.runtime.worker.main import (
    DEFAULT_ASYNCIO_CONCURRENCY,
    DEFAULT_THREADS,
    given_pool,
    pool_setting,
    worker_argv,
)
from lattice_worker.runtime.worker.registry import TeamNotServedError, TeamRegistry


def test_the_default_pool_is_the_asyncio_pool_with_many_steps_in_flight():
    argv = worker_argv(["q"], "node@h", None, [])
    # Celery finds the pool in app.conf.worker_pool: the argv names none
    assert "--pool" not in argv and "-P" not in argv
    assert argv[argv.index("--concurrency") + 1] == str(DEFAULT_ASYNCIO_CONCURRENCY) == "300"
    assert pool_setting([]) == POOL_PATH
    argv = worker_argv(["q"], "node@h", 50, [])
    assert argv[argv.index("--concurrency") + 1] == "50"


@pytest.mark.parametrize(
    "pool_args", [["--pool", "asyncio"], ["--pool=asyncio"], ["-P", "asyncio"], ["-Pasyncio"]]
)
def test_naming_the_asyncio_pool_is_the_default(pool_args):
    argv = worker_argv(["q"], "node@h", None, [*pool_args, "--without-gossip"])
    assert "asyncio" not in " ".join(argv) and argv[-1] == "--without-gossip"
    assert pool_setting(pool_args) == POOL_PATH


def test_the_pool_path_names_the_pool_class():
    from celery.concurrency import get_implementation

    assert get_implementation(POOL_PATH) is AsyncioPool


def test_the_threads_pool_gets_many_threads():
    argv = worker_argv(["q"], "node@h", None, ["--pool", "threads"])
    assert argv[argv.index("--concurrency") + 1] == str(DEFAULT_THREADS) == "200"
    assert pool_setting(["--pool", "threads"]) is None


@pytest.mark.parametrize(
    "pool_args", [["--pool", "prefork"], ["--pool=prefork"], ["-P", "prefork"], ["-Pprefork"]]
)
def test_a_given_pool_is_kept_and_gets_celerys_default_size(pool_args):
    assert given_pool(pool_args) == "prefork"
    argv = worker_argv(["q"], "node@h", None, pool_args)
    assert argv.count("--pool") + argv.count("-P") <= 1 and "threads" not in argv
    assert pool_setting(pool_args) is None
    assert "--concurrency" not in argv  # Celery's own default (one process per CPU)
    assert "4" in worker_argv(["q"], "node@h", 4, pool_args)


def _loop_of_run() -> asyncio.AbstractEventLoop:
    async def which() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    return loops.run(which())


def test_each_task_thread_of_the_threads_pool_keeps_its_own_loop():
    pairs: list[tuple[asyncio.AbstractEventLoop, asyncio.AbstractEventLoop]] = []

    def task_thread() -> None:
        pairs.append((_loop_of_run(), _loop_of_run()))

    threads = [threading.Thread(target=task_thread) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len({id(first) for first, _ in pairs}) == 3
    assert all(first is second for first, second in pairs)  # reused, task after task


def test_a_worker_refuses_a_team_it_was_not_started_with_and_imports_nothing():
    registry = TeamRegistry(MemoryMailbox())
    registry.load("tests.e2e.teams:team")
    assert registry.serving("e2e", "host:1:abc").name == "e2e"
    with pytest.raises(TeamNotServedError) as refused:
        registry.serving("lattice_never_imported_q:team", "host:1:abc")
    message = str(refused.value)
    assert "'lattice_never_imported_q:team' is not served by worker host:1:abc" in message
    assert "it serves: e2e" in message
    assert "lattice_never_imported_q" not in sys.modules
