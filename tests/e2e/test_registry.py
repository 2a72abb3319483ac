"""End-to-end: the live worker registry and who may run what, with real ``lattice worker`` processes.

Issue 10 items 4 and 6. A worker runs only the teams it was started with: a
run record written straight to Redis naming another team (or another
module) fails with an error naming the team and the worker, and the module
is never imported (it would write a marker file). Workers publish their
teams and queues with an expiring heartbeat: ``lattice status`` lists them
per queue, a stopped worker leaves the registry at once, a killed one when
its entry expires, and after a restart of Redis (a server this test starts
on its own port, without persistence) the entries are back within about a
heartbeat.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest
import redis

from lattice_client import LatticeClient, RunStore
from lattice_client.celery_config import RUN_LEAD_TASK, make_celery_app, queue_name
from lattice_client.settings import get_settings
from tests.e2e.conftest import LATTICE, REPO, Deployment, wait_for
from tests.e2e.teams import plan
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(180)]

MARKER_MODULE = """
from pathlib import Path

Path({marker!r}).write_text("imported")

from tests.e2e.teams import team  # noqa: E402  (a real team, should it ever be loaded)
"""


def _send_run_lead(prefix: str, broker_url: str, run_id: str, queue: str) -> None:
    app = make_celery_app(get_settings(broker_url=broker_url, key_prefix=prefix))
    try:
        app.send_task(RUN_LEAD_TASK, args=[run_id], queue=queue)
    finally:
        app.close()


async def _create(prefix: str, broker_url: str, run_id: str, team: str, team_ref: str | None) -> None:
    store = RunStore(broker_url, prefix)
    try:
        await store.create(run_id, team, "hello", team_ref=team_ref)
    finally:
        await store.aclose()


def test_a_run_naming_another_team_or_module_is_refused_and_nothing_is_imported(deployment, tmp_path):
    import asyncio

    d: Deployment = deployment
    module = "lattice_marker_team"
    marker = tmp_path / "imported.marker"
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{module}.py").write_text(MARKER_MODULE.format(marker=str(marker)))
    env = {"PYTHONPATH": f"{REPO}:{site}"}  # the worker could import the module if it tried
    worker = d.worker("tests.e2e.teams:team", env=env)
    broker = d.env["LATTICE_BROKER_URL"]
    lead_queue = queue_name(d.prefix, "e2e", "lead")

    # a record naming a team this worker was not started with, with a reference to the marker module
    asyncio.run(_create(d.prefix, broker, "forged-other", "evil", f"{module}:team"))
    _send_run_lead(d.prefix, broker, "forged-other", lead_queue)
    result = d.client.wait("forged-other", timeout=30)
    assert result.status == "failed"
    assert "team 'evil' is not served by worker" in result.error and "it serves: e2e" in result.error
    assert "nothing a run names is imported" in result.error
    assert "refused" in worker.wait_log(r"run forged-other (refused)")[0]

    # a record naming the worker's own team with another module: runs the team the worker
    # serves, and the recorded reference is never imported either
    asyncio.run(_create(d.prefix, broker, "forged-ref", "e2e", f"{module}:team"))
    _send_run_lead(d.prefix, broker, "forged-ref", lead_queue)
    assert d.client.wait("forged-ref", timeout=30).result == "direct: hello"
    assert not marker.exists()
    assert worker.alive()


def _nodes(client: LatticeClient) -> dict[str, list[str]]:
    # queue -> node names of the live workers consuming it
    try:
        workers = client.status().workers
    except (redis.RedisError, OSError):
        return {}
    out: dict[str, list[str]] = {}
    for worker in workers:
        for queue in worker.queues:
            out.setdefault(queue, []).append(worker.node)
    return {q: sorted(n) for q, n in out.items()}


def test_the_registry_follows_live_workers_and_comes_back_after_a_redis_restart(tmp_path):
    server = RedisServer()
    server.start()
    heartbeat = 1.0
    d = Deployment(tmp_path, broker_url=server.url, registry_heartbeat_seconds=heartbeat)
    client = LatticeClient(broker_url=server.url, key_prefix=d.prefix)
    try:
        leads = d.worker("tests.e2e.teams:team", "--member", "lead")
        members = d.worker("tests.e2e.teams:team", "--member", "worker", "--member", "other")
        q = {m: queue_name(d.prefix, "e2e", m) for m in ("lead", "worker", "other")}
        nodes = wait_for(lambda: len(_nodes(client)) == 3 and _nodes(client), 15, "both workers registered")
        (lead_node,) = nodes[q["lead"]]
        (member_node,) = nodes[q["worker"]]
        assert nodes[q["other"]] == [member_node] and lead_node != member_node
        # before any message: each worker publishes every member mailbox of its team
        assert client.known_mailboxes("e2e") == ["e2e::other", "e2e::worker"]
        report = client.status("e2e")
        assert {tuple(w.mailboxes) for w in report.workers} == {("e2e::other", "e2e::worker")}
        assert {(w.node, w.pool, w.concurrency) for w in report.workers} == {
            (lead_node, "asyncio", 300),
            (member_node, "asyncio", 300),
        }  # the default pool and size
        assert (
            client.submit("e2e", plan(("worker", "ask", "t1"))).wait(timeout=60).result
            == "final: ask:worked[t1]"
        )

        # `lattice status` prints the live workers per queue
        shown = subprocess.run(
            [LATTICE, "--broker-url", server.url, "--key-prefix", d.prefix, "status", "e2e"],
            capture_output=True, text=True, timeout=60, cwd=REPO, env={**d.env, "COLUMNS": "250"},
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        rows = {
            line.split()[0]: line for line in shown.stdout.splitlines() if line.strip().startswith(d.prefix)
        }
        assert lead_node in rows[q["lead"]] and "asyncio x 300" in rows[q["lead"]]
        assert member_node in rows[q["worker"]] and rows[q["worker"]].split()[1] == "1"

        # Redis restarts empty: the registry is back within about one heartbeat
        before = server.admin().info("server")["run_id"]
        server.stop()
        server.start()
        # a new, empty server (it keeps nothing on disk). Not `_nodes(client) == {}`: a
        # worker's heartbeat may already have registered again by the time we look.
        assert server.admin().info("server")["run_id"] != before
        restarted = time.monotonic()
        wait_for(
            lambda: len(_nodes(client)) == 3, heartbeat + 5, "the registry to come back after the restart"
        )
        assert time.monotonic() - restarted < heartbeat + 5
        assert _nodes(client) == nodes

        # a warm shutdown removes the worker at once; a kill -9 when its entry expires (3 beats)
        members.stop()
        assert set(_nodes(client)) == {q["lead"]}
        leads.kill9()
        assert set(_nodes(client)) == {q["lead"]}  # still there until it expires
        wait_for(lambda: _nodes(client) == {}, 3 * heartbeat + 5, "the killed worker's entry to expire")
        client.aio._teams.clear()  # past the client's short cache of live answers
        with pytest.raises(ValueError, match="no live worker serves team 'e2e'"):
            client.submit("e2e", "hi")
        queued = client.submit("e2e", "hi", require_registered=False)  # queued with a warning
        assert client.get_run(queued.run_id).status.value == "queued"
    finally:
        client.close()
        with contextlib.suppress(Exception):
            d.close()  # stops the workers (the keys die with this test's server)
        server.stop()


def test_a_cold_shutdown_leaves_the_registry_at_once(deployment_factory):
    # SIGQUIT (Celery's cold shutdown) sends no worker_shutdown signal: the entry stayed
    # live until it expired (three heartbeats, 60 s here) and submits were accepted
    d = deployment_factory(registry_heartbeat_seconds=20.0)
    doomed = d.worker("tests.e2e.teams:team")
    assert [w.node for w in d.client.status("e2e").workers]
    os.killpg(doomed.pgid, signal.SIGQUIT)
    doomed.proc.wait(20)
    assert d.client.status("e2e").workers == []
    d.client.aio._teams.clear()  # past the client's short cache of live answers
    with pytest.raises(ValueError, match="no live worker serves team 'e2e'"):
        d.client.submit("e2e", "hi")
