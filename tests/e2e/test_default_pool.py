"""End-to-end: the default pool (the asyncio pool, 200 steps in flight) and the threads pool
under kill -9, cancellation, blocking tools, a tool calling ``sys.exit()`` and a SIGTERM to a
prefork pool process.

Issue 10 item 7. Many member calls are in flight in ONE worker process; its
process group is killed with SIGKILL while they work. Another worker
recovers every one of them after the lease (each executed once more, none
lost, none left processing). A run cancelled while its member works stops
that member (its lease check aborts it). On the asyncio pool every step of a
process shares one event loop: a tool whose handler is a plain blocking
function runs in a thread, so it stalls no other step.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

from tests.e2e.conftest import wait_for
from tests.e2e.teams import plan

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]

RUNS = 6


@pytest.mark.parametrize(
    ("pool_args", "pool", "stop"),
    [([], "asyncio", "kill9"), (["--pool", "threads"], "threads", "kill9"), ([], "asyncio", "cold")],
    ids=["asyncio", "threads", "asyncio-cold-shutdown"],
)
def test_kill9_of_a_worker_with_many_calls_in_flight_recovers_them_all(
    deployment_factory, pool_args, pool, stop
):
    # "cold": SIGQUIT, Celery's cold shutdown (docs/deploy.md): the pool stops its loop
    # with the calls mid-way, the process exits at once, and they are recovered as after a kill
    d = deployment_factory(lease_seconds=2, max_attempts=3)
    doomed = d.worker("tests.e2e.teams:team", *pool_args)  # the pool's default size
    [info] = d.client.status("e2e").workers
    assert (info.pool, info.concurrency) == (pool, 300 if pool == "asyncio" else 200)
    tasks = [f"job{i} hang-first" for i in range(RUNS)]
    handles = [d.client.submit("e2e", plan(("worker", "handoff", task))) for task in tasks]
    # every member call is in flight at once in the one process
    wait_for(lambda: all(f"start:{t}" in d.work_log() for t in tasks), 45, "every member call to start")
    pids = {entry.split(":")[-1] for entry in d.redis.lrange(f"{d.prefix}:test:pids", 0, -1)}
    assert pids == {str(doomed.proc.pid)}  # the worker's own process runs them all
    if stop == "cold":
        os.killpg(doomed.pgid, signal.SIGQUIT)
        doomed.proc.wait(20)  # it exits by itself, without finishing its steps
        assert "Unrecoverable error" not in doomed.log() and "end:" not in d.work_log()
    else:
        doomed.kill9()
    assert len(d.client.inbox("e2e::worker", "processing")) == RUNS

    d.worker("tests.e2e.teams:team")  # recovered on the default pool
    for handle, task in zip(handles, tasks, strict=True):
        result = handle.wait(timeout=60)
        assert result.status == "completed", result
        assert result.result == f"final: done:worked[{task}]"
        assert d.executions(task) == 2
    messages = d.client.inbox("e2e::worker", "all")
    assert sorted((m.status.value, m.attempts) for m in messages) == [("done", 2)] * RUNS


def test_cancel_stops_a_member_working_on_the_default_pool(deployment):
    d = deployment
    worker = d.worker("tests.e2e.teams:team")
    handle = d.client.submit("e2e", plan(("worker", "handoff", "long sleep=40")))
    wait_for(lambda: "start:long sleep=40" in d.work_log(), 30, "the member to start")
    report = d.client.cancel(handle.run_id)
    assert report.status.value == "cancelled"
    assert handle.wait(timeout=10).status == "cancelled"
    # the member's lease check aborts it: it never ends its work, and nothing stays processing
    wait_for(lambda: not d.client.inbox("e2e::worker", "processing"), 30, "the member to be stopped")
    assert "end:long sleep=40" not in d.work_log()
    assert [m.status.value for m in d.client.inbox("e2e::worker", "all")] == ["cancelled"]
    # the tool ignores its signal: the step is cancelled soon after, not 40 s later, freeing its slot
    worker.wait_log(r"lattice\.deliver\[[^\]]+\] succeeded in [0-9.]+s: '(lost|cancelled)'", timeout=20)
    assert "end:long sleep=40" not in d.work_log()


def test_a_blocking_tool_on_the_default_pool_stalls_no_other_step(deployment):
    d = deployment
    d.worker("tests.e2e.teams:blocking_team")
    slow = d.client.submit("e2e_blocking", plan(("worker", "handoff", "slow sleep=6")))
    wait_for(lambda: "start:slow sleep=6" in d.work_log(), 30, "the blocking tool to start")
    quick = d.client.submit("e2e_blocking", plan(("worker", "handoff", "quick")))
    assert quick.wait(timeout=30).result == "final: done:worked[quick]"
    # the quick run's three steps went through the process while the handler blocked
    assert "end:slow sleep=6" not in d.work_log()
    assert slow.wait(timeout=30).result == "final: done:worked[slow sleep=6]"


def test_more_steps_sending_at_once_than_celerys_producer_pool_holds_all_finish(deployment):
    # 15 runs on the threads pool: 15 steps send their next step at once from 15
    # threads, beyond Celery's producer pool (broker_pool_limit 10): none may wait forever
    d = deployment
    d.worker("tests.e2e.teams:team", "--pool", "threads", "--concurrency", "20")
    handles = [d.client.submit("e2e", plan(("worker", "handoff", f"many{i} sleep=1"))) for i in range(15)]
    for i, handle in enumerate(handles):
        assert handle.wait(timeout=60).result == f"final: done:worked[many{i} sleep=1]"


@pytest.mark.parametrize("pool_args", [[], ["--pool", "threads"]], ids=["asyncio", "threads"])
def test_a_step_that_raises_system_exit_fails_its_task_and_is_recovered_by_lease(
    deployment_factory, pool_args
):
    # A tool calling sys.exit() on its first execution: the step's task fails (acknowledged,
    # not left holding one of the worker's slots), the worker lives on, and the claim's
    # expiry recovers the work item like a crash's.
    d = deployment_factory(lease_seconds=2, max_attempts=3)
    worker = d.worker("tests.e2e.teams:team", *pool_args)
    handle = d.client.submit("e2e", plan(("worker", "handoff", "job exit-first")))
    result = handle.wait(timeout=60)
    assert result.status == "completed", result
    # the failed attempt recorded its tool call as withheld; the next attempt replied with that
    assert result.result.startswith("final: done:Error: this tool call's result was withheld")
    [message] = d.client.inbox("e2e::worker", "all")
    assert (message.status.value, message.attempts) == ("done", 2)
    assert worker.alive()
    worker.wait_log("StepInterruptedError")
    # every Celery message was acknowledged: kombu's unacked-restore hash is empty
    wait_for(lambda: d.redis.hlen(f"{d.prefix}:unacked") == 0, 10, "no message left unacknowledged")


def test_sigterm_to_a_prefork_pool_process_ends_it_and_its_step_is_requeued(deployment_factory):
    # billiard's SIGTERM handler raises SystemExit inside the pool process: that is the
    # process ending (a cold shutdown, a revoke with terminate), not a step's error. The
    # process exits, and Celery requeues the message (reject_on_worker_lost).
    d = deployment_factory(lease_seconds=2, max_attempts=3)
    worker = d.worker("tests.e2e.teams:team", "--pool", "prefork", "--concurrency", "1")
    handle = d.client.submit("e2e", plan(("worker", "handoff", "job hang-first")))
    wait_for(lambda: "start:job hang-first" in d.work_log(), 30, "the member to start")
    [entry] = d.redis.lrange(f"{d.prefix}:test:pids", 0, -1)
    child = int(entry.split(":")[-1])
    assert child != worker.proc.pid  # the pool process, not the worker's main process
    os.kill(child, signal.SIGTERM)
    wait_for(lambda: not _running(child), 10, "the pool process to exit")
    result = handle.wait(timeout=60)
    assert result.status == "completed" and result.result == "final: done:worked[job hang-first]"
    assert "StepInterruptedError" not in worker.log()
    worker.wait_log("WorkerLostError|Process .* exited|signal 15")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie the worker has not reaped yet is gone too
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True
