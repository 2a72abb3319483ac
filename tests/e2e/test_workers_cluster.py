"""End-to-end on a Redis Cluster: the mailboxes, runs and worker registry on the
session's own cluster (3 masters, one replica each; tests/support/redis_cluster.py),
the Celery broker on the tests' plain Redis.

Issue 21 item 2. The worker tests of test_workers.py and the kill -9 tests of
test_default_pool.py run again here (imported, so pytest collects them again
in this module; ``E2E_STATE = "cluster"`` makes tests/e2e/conftest.py give
every deployment ``LATTICE_MAILBOX_URL=redis+cluster://...``): all runs
complete, none lost, none doubled. The failover tests move a master's slots
to its replica while runs are in flight -- ``CLUSTER FAILOVER`` on the
replica, and kill -9 of a master -- and every run must complete with every
tool call run once.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.e2e.conftest import wait_for
from tests.e2e.teams import plan
from tests.e2e.worker_suite import *  # noqa: F403 (collected again here, on the cluster)

E2E_STATE = "cluster"
"""The deployments' mailboxes, runs and registry: the session's Redis Cluster (tests/e2e/conftest.py)."""

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.cluster, pytest.mark.timeout(180)]


def test_runs_and_mailboxes_live_on_the_cluster_and_the_broker_on_one_redis(deployment, redis_cluster):
    d = deployment
    worker = d.worker("tests.e2e.teams:team", "--concurrency", "1")
    result = d.client.submit("tests.e2e.teams:team", plan(("worker", "handoff", "c1"))).wait(timeout=60)
    assert result.status == "completed", result
    assert result.result == "final: done:worked[c1]"
    record = f"{d.prefix}:run:{{run:{result.run_id}}}"
    assert d.state.exists(record) and not d.redis.exists(record)  # the run is on the cluster
    assert redis_cluster.master_of(record) in redis_cluster.masters()
    # the mailboxes too, spread over the masters by their hash tags; nothing of them on the broker's Redis
    boxes = d.client.status("e2e").mailboxes
    assert boxes["e2e::worker"]["done"] == 1, boxes
    assert not list(d.redis.scan_iter(match=f"{d.prefix}:{{*", count=1000))
    assert [w.node for w in d.client.status("e2e").workers]  # the registry answers from the cluster
    assert "transport:   redis://" in worker.log()  # Celery's banner: the broker is one Redis


RUNS = 6


def _submit_runs(d, tag: str) -> list[tuple[object, list[str]]]:
    """``RUNS`` runs of the e2e team, each calling both members once (tools that sleep 1 s)."""
    runs = []
    for i in range(RUNS):
        tasks = [f"{tag}{i}a sleep=1", f"{tag}{i}b sleep=1"]
        handle = d.client.submit("e2e", plan(("worker", "handoff", tasks[0]), ("other", "handoff", tasks[1])))
        runs.append((handle, tasks))
    return runs


def _assert_every_run_completed_and_every_call_ran_once(d, runs) -> None:
    for handle, tasks in runs:
        result = handle.wait(timeout=90)
        assert result.status == "completed", result
        assert result.result == f"final: done:worked[{tasks[0]}] | done:worked[{tasks[1]}]"
        for task in tasks:
            assert d.executions(task) == 1, (task, d.work_log())
    for box in ("e2e::worker", "e2e::other"):
        messages = d.client.inbox(box, "all")
        assert len(messages) == RUNS and {m.status.value for m in messages} == {"done"}, messages


def test_cluster_failover_of_every_master_mid_run_loses_and_doubles_nothing(deployment, redis_cluster):
    d = deployment
    d.worker("tests.e2e.teams:team")
    runs = _submit_runs(d, "fo")
    wait_for(lambda: any(e.startswith("start:") for e in d.work_log()), 45, "the first member call to start")
    moved = []
    for master in redis_cluster.masters():  # CLUSTER FAILOVER on each master's replica, one after another
        moved.append(redis_cluster.failover(master))
        time.sleep(0.3)
    assert len(set(moved)) == 3 and sorted(moved) == redis_cluster.masters()  # every slot changed master
    _assert_every_run_completed_and_every_call_ran_once(d, runs)
    assert all(m.attempts == 1 for box in ("e2e::worker", "e2e::other") for m in d.client.inbox(box, "all"))


def test_kill9_of_a_master_mid_run_every_run_completes_and_every_call_runs_once(deployment, redis_cluster):
    d = deployment
    d.worker("tests.e2e.teams:team")
    runs = _submit_runs(d, "k9")
    wait_for(lambda: any(e.startswith("start:") for e in d.work_log()), 45, "the first member call to start")
    # the master of the first run's record: its run, and the mailboxes on that node, lose their master
    victim = redis_cluster.master_of(f"{d.prefix}:run:{{run:{runs[0][0].run_id}}}")
    redis_cluster.kill_master(victim)
    redis_cluster.wait_promoted(victim)
    rejoined = threading.Thread(target=redis_cluster.restart_node, args=(victim,))  # back, as a replica
    rejoined.start()
    try:
        _assert_every_run_completed_and_every_call_ran_once(d, runs)
    finally:
        rejoined.join(60)
    assert victim not in redis_cluster.masters()
