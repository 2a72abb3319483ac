"""``lattice worker``'s pool defaults, the task loops (per thread / shared), the registry's refusal."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from lattice_mailbox.memory import MemoryMailbox
from lattice_worker.runtime import loops
from lattice_worker.runtime.registry import TeamNotServedError, TeamRegistry
from lattice_worker.runtime.worker_main import DEFAULT_THREADS, given_pool, worker_argv


def test_the_default_pool_is_threads_with_many_threads():
    argv = worker_argv(["q"], "node@h", None, [])
    assert argv[argv.index("--pool") + 1] == "threads"
    assert argv[argv.index("--concurrency") + 1] == str(DEFAULT_THREADS) == "200"
    argv = worker_argv(["q"], "node@h", 50, [])
    assert argv[argv.index("--concurrency") + 1] == "50"


@pytest.mark.parametrize(
    "pool_args", [["--pool", "prefork"], ["--pool=prefork"], ["-P", "prefork"], ["-Pprefork"]]
)
def test_a_given_pool_is_kept_and_gets_celerys_default_size(pool_args):
    assert given_pool(pool_args) == "prefork"
    argv = worker_argv(["q"], "node@h", None, pool_args)
    assert argv.count("--pool") + argv.count("-P") <= 1 and "threads" not in argv
    assert "--concurrency" not in argv  # Celery's own default (one process per CPU)
    assert "4" in worker_argv(["q"], "node@h", 4, pool_args)


def _loop_of_run() -> asyncio.AbstractEventLoop:
    async def which() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    return loops.run(which())


def _loops_from_threads(n: int) -> list[asyncio.AbstractEventLoop]:
    found: list[asyncio.AbstractEventLoop] = []
    threads = [threading.Thread(target=lambda: found.append(_loop_of_run())) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return found


def test_thread_mode_gives_each_task_thread_its_own_loop(monkeypatch):
    monkeypatch.delenv(loops.LOOP_MODE_ENV, raising=False)
    found = _loops_from_threads(3)
    assert len({id(loop) for loop in found}) == 3


def test_shared_mode_runs_every_task_thread_on_one_loop_thread(monkeypatch):
    monkeypatch.setenv(loops.LOOP_MODE_ENV, "shared")
    found = _loops_from_threads(3)
    assert len({id(loop) for loop in found}) == 1 and found[0] is loops.shared_loop()
    monkeypatch.setenv(loops.LOOP_MODE_ENV, "bogus")
    with pytest.raises(ValueError, match="LATTICE_WORKER_LOOP must be 'thread' or 'shared'"):
        loops.loop_mode()


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
