"""End-to-end: a worker killed (``kill -9`` of its process group) during a lead turn.

Issue 6, crash safety of lead segments; docs/architecture.md "Crash: leases and fencing". The
lead's tool batch sends two member tasks and then stalls in a tool of its own
(``chore ... hang-first``); the worker is killed there. Another worker's
reaper finds the run's expired lead lease, the run resumes from its persisted
history on that worker, and completes -- each member task executed once.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import wait_for
from tests.e2e.teams import plan

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(120)]


def test_kill9_during_a_lead_turn_the_run_completes_on_another_worker_once(deployment_factory):
    d = deployment_factory(lease_seconds=2, max_attempts=3)
    doomed = d.worker("tests.e2e.teams:team", "--concurrency", "1")
    prompt = plan(("worker", "handoff", "m1"), ("other", "ask", "m2"), ("chore", "ask", "stall hang-first"))
    handle = d.client.submit("tests.e2e.teams:team", prompt)
    wait_for(lambda: "start:stall hang-first" in d.work_log(), 30, "the lead's tool batch to stall")
    # both member tasks are in their mailboxes, the run is mid-turn
    assert [m.content for m in d.client.inbox("e2e::worker", "pending")] == ["m1"]
    assert [m.content for m in d.client.inbox("e2e::other", "pending")] == ["m2"]
    assert d.client.get_run(handle.run_id).status.value == "running"
    doomed.kill9()

    d.worker("tests.e2e.teams:team", "--concurrency", "1")
    result = handle.wait(timeout=60)
    assert result.status == "completed", result
    assert result.result == "final: ask:worked[m2] | ask:worked[stall hang-first] | done:worked[m1]"
    # each member task was sent once and executed once; the lead's own tool ran again
    assert d.executions("m1") == 1 and d.executions("m2") == 1
    assert d.executions("stall hang-first") == 2
    for box in ("e2e::worker", "e2e::other"):
        assert [(m.status.value, m.attempts) for m in d.client.inbox(box, "all")] == [("done", 1)]
    assert {m.status.value for m in d.client.inbox("e2e::lead", "all")} == {"done"}
    events = list(d.client.events(handle.run_id, timeout=10))
    recovering = [e for e in events if e.get("type") == "run_status" and e.get("status") == "recovering"]
    assert [e["attempt"] for e in recovering] == [2]
