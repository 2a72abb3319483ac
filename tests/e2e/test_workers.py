"""End-to-end: real ``lattice worker`` processes, the real Redis, the client in this process.

Issue 6 "Must show" (a)-(f); docs/architecture.md, docs/deploy.md. Teams come from
``lattice_worker/examples/team.py`` and ``tests/e2e/teams.py``; every model is scripted and
stateless, every tool is real.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from lattice_client.celery_config import make_celery_app, queue_name
from lattice_client.runstore import RunStore
from lattice_worker.examples.team import demo_prompt
from tests.e2e.conftest import Deployment, wait_for
from tests.e2e.teams import plan

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]


def statuses(d: Deployment, team: str) -> dict[str, dict[str, int]]:
    report = d.client.status(team)
    return {box: {k: v for k, v in counts.items() if v} for box, counts in report.mailboxes.items()}


def run_status(d: Deployment, run_id: str) -> str:
    record = d.client.get_run(run_id)
    return record.status.value if record else "missing"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("the lease holds\nthe lease expires\nnothing else\n")
    (root / "b.md").write_text("# notes\nLease renewal every third of a lease.\n")
    (root / "sub" / "c.py").write_text("x = 1\n# no match here\n")
    return root


def test_a_example_team_completes_on_one_worker_process_consuming_every_queue(deployment, corpus):
    d = deployment
    worker = d.worker("lattice_worker.examples.team:team", "--concurrency", "1")
    log = worker.log()
    for member in ("lead", "searcher", "counter"):
        assert f"{d.prefix}.demo.{member}" in log  # one process consumes every queue of the team
    handle = d.client.submit("lattice_worker.examples.team:team", demo_prompt(str(corpus), "lease"))
    result = handle.wait(timeout=60)
    assert result.status == "completed", result
    # the members' built-in Grep / Bash read the corpus: a.txt 2 of 3 lines match, b.md 1 of 2, sub/c.py 0 of 2
    assert '"lease" is on 3 lines in 2 of 3 text files' in result.result
    assert "7 lines in 3 text files" in result.result
    # ... working in their default workspaces under the (temporary) HOME the workers inherited
    workspaces = Path(os.environ["HOME"]) / ".agent" / "workspaces"
    assert sorted(p.name for p in workspaces.iterdir()) == ["counter", "searcher"]
    # every message of the team is done: tasks, replies (read by the lead)
    counts = statuses(d, "demo")
    assert counts == {"demo::counter": {"done": 1}, "demo::lead": {"done": 2}, "demo::searcher": {"done": 1}}
    # the stream carries the team events and ends with the result
    events = list(d.client.events(handle.run_id, timeout=10))
    types = [e["type"] for e in events]
    assert types[-1] == "run_result"
    assert types.count("team_agent") == 4 and "team_message" in types
    # every step was a Celery task of its own, through the broker (none ran inline)
    worker.wait_log(r"lattice\.resume_lead\[[^\]]+\] succeeded")
    log = worker.log()
    assert len(re.findall(r"lattice\.run_lead\[[^\]]+\] succeeded", log)) == 1, log
    assert len(re.findall(r"lattice\.deliver\[[^\]]+\] succeeded", log)) >= 2, log


def test_b_two_workers_on_one_member_queue_overlap_that_members_work_items(deployment):
    d = deployment
    first = d.worker("tests.e2e.teams:team", "--concurrency", "1")
    second = d.worker("tests.e2e.teams:team", "--member", "worker", "--concurrency", "1")
    # each task waits (up to 30 s) until both have started: only parallel workers get past it quickly
    prompt = plan(("worker", "handoff", "p1 barrier=2"), ("worker", "handoff", "p2 barrier=2"))
    result = d.client.submit("tests.e2e.teams:team", prompt).wait(timeout=60)
    assert result.status == "completed"
    log = d.work_log()
    assert [entry.split(":")[0] for entry in log] == ["start", "start", "end", "end"], log
    # two different worker processes ran them
    pids = {entry.rsplit(":", 1)[1] for entry in d.redis.lrange(f"{d.prefix}:test:pids", 0, -1)}
    assert len(pids) == 2, pids
    assert first.alive() and second.alive()


def test_c_kill9_while_a_member_works_recovers_after_the_lease(deployment_factory):
    # on the prefork pool (CPU-bound tools); tests/e2e/test_threads_pool.py kills the default pool
    d = deployment_factory(lease_seconds=2, max_attempts=3)
    doomed = d.worker("tests.e2e.teams:team", "--pool", "prefork", "--concurrency", "1")
    handle = d.client.submit("tests.e2e.teams:team", plan(("worker", "handoff", "job hang-first")))
    wait_for(lambda: "start:job hang-first" in d.work_log(), 30, "the member to start working")
    doomed.kill9()
    [message] = d.client.inbox("e2e::worker", "processing")
    assert message.attempts == 1
    d.worker("tests.e2e.teams:team", "--pool", "prefork", "--concurrency", "1")
    result = handle.wait(timeout=60)
    assert result.status == "completed", result
    assert result.result == "final: done:worked[job hang-first]"
    [message] = d.client.inbox("e2e::worker", "all")
    assert (message.status.value, message.attempts) == ("done", 2)
    assert d.executions("job hang-first") == 2
    for counts in statuses(d, "e2e").values():
        assert "processing" not in counts and "pending" not in counts


def test_d_duplicated_doorbell_and_redelivered_messages_execute_once(deployment):
    d = deployment
    settings = d.settings
    lead_queue = queue_name(d.prefix, "e2e", "lead")
    member_queue = queue_name(d.prefix, "e2e", "worker")
    handle = d.client.submit("e2e", plan(("worker", "handoff", "dup")), require_registered=False)
    # the broker redelivers the run_lead message: the same raw message twice on the queue
    d.redeliver(lead_queue)
    leads = d.worker("tests.e2e.teams:team", "--member", "lead", "--concurrency", "1")
    leads.wait_log(r"lattice\.run_lead\[.*succeeded.*'(suspended|skipped)'", count=2)
    assert sorted(re.findall(r"lattice\.run_lead\[.*succeeded.*'(\w+)'", leads.log())) == [
        "skipped",
        "suspended",
    ]
    # the deliver message redelivered, plus one more doorbell for the same mailbox
    d.redeliver(member_queue)
    app = make_celery_app(settings)
    try:
        app.send_task("lattice.deliver", args=["e2e::worker"], queue=member_queue)
    finally:
        app.close()
    assert d.queue_length(member_queue) == 3
    members = d.worker("tests.e2e.teams:team", "--member", "worker", "--concurrency", "1")
    assert handle.wait(timeout=60).result == "final: done:worked[dup]"
    members.wait_log(r"lattice\.deliver\[.*succeeded.*'(done|idle)'", count=3)
    outcomes = sorted(re.findall(r"lattice\.deliver\[.*succeeded.*'(\w+)'", members.log()))
    # the three doorbells: one does the work, the duplicates find nothing to claim. On a
    # slow machine the reaper may ring once more for a message pending over a lease
    # (docs/architecture.md): another no-op, never a second execution
    assert outcomes[0] == "done" and set(outcomes[1:]) == {"idle"} and len(outcomes) >= 3, outcomes
    assert d.executions("dup") == 1
    leads.wait_log(r"lattice\.resume_lead\[.*succeeded.*'completed'")


def test_e_cancel_with_no_worker_online_then_the_work_never_runs(deployment):
    d = deployment
    leads = d.worker("tests.e2e.teams:team", "--member", "lead", "--concurrency", "1")
    handle = d.client.submit(
        "tests.e2e.teams:team", plan(("worker", "handoff", "never1"), ("other", "handoff", "never2"))
    )
    wait_for(lambda: run_status(d, handle.run_id) == "suspended", 30, "the run to suspend")
    # the registration that suspends the run comes back before its doorbells are sent
    boxes = [queue_name(d.prefix, "e2e", member) for member in ("worker", "other")]
    wait_for(lambda: [d.queue_length(q) for q in boxes] == [1, 1], 30, "the doorbells to be sent")
    leads.stop()
    report = d.client.cancel(handle.run_id)
    assert report.status.value == "cancelled" and len(report.cancelled_messages) == 2
    assert d.queue_length(queue_name(d.prefix, "e2e", "worker")) == 1  # the doorbell still waits
    everything = d.worker("tests.e2e.teams:team", "--concurrency", "1")
    everything.wait_log(r"lattice\.deliver\[.*succeeded.*'idle'", count=2)
    assert d.executions("never1") == 0 and d.executions("never2") == 0
    assert handle.wait(timeout=5).status == "cancelled"
    assert {
        m.status.value for m in d.client.inbox("e2e::worker", "all") + d.client.inbox("e2e::other", "all")
    } == {"cancelled"}
    assert run_status(d, handle.run_id) == "cancelled"


def test_f_a_pickled_task_message_is_refused_and_nothing_runs(deployment):
    d = deployment
    worker = d.worker("tests.e2e.teams:team", "--concurrency", "1")
    lead_queue = queue_name(d.prefix, "e2e", "lead")
    settings = d.settings
    run_id = "run_pickled"

    async def create() -> None:
        store = RunStore(d.state_url, d.prefix)
        await store.create(run_id, "e2e", "hello")
        await store.aclose()

    asyncio.run(create())
    evil = make_celery_app(settings)
    evil.conf.accept_content = ["pickle", "json"]
    try:
        evil.send_task("lattice.run_lead", args=[run_id], queue=lead_queue, serializer="pickle")
    finally:
        evil.close()
    worker.wait_log(r"(?i)refusing to deserialize untrusted content of type pickle")
    wait_for(lambda: d.queue_length(lead_queue) == 0, 10, "the refused message to leave the queue")
    assert run_status(d, run_id) == "queued"
    assert "lattice.run_lead[" not in worker.log()  # never received as a task
    # the same task as JSON runs: the worker was able to, it refused the format
    plain = make_celery_app(settings)
    try:
        plain.send_task("lattice.run_lead", args=[run_id], queue=lead_queue)
    finally:
        plain.close()
    assert d.client.wait(run_id, timeout=30).result == "direct: hello"
    payload = json.loads(d.state.hget(f"{d.prefix}:run:{{run:{run_id}}}", "result"))
    assert payload["status"] == "completed"
