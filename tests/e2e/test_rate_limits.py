"""End-to-end: shared model rate limits with real ``lattice worker`` processes (issue 22).

Two worker processes share ``LATTICE_MODEL_LIMITS`` (a short ``period_seconds``
so turns come within seconds). Calls past the limit end their steps, which
come back through Celery's countdown on a real worker; every run completes
with the answer it gets without limits, and the runs' events name the limit
that made the calls wait.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import Deployment
from tests.e2e.teams import plan

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(240)]

TEAM_REF = "tests.e2e.teams:team"
LIMITS = {"*": {"requests_per_minute": 3, "period_seconds": 3}}
"""Three calls at once, then one a second, for every model of the teams (their key: none)."""


def test_runs_over_the_limit_wait_their_turn_on_real_workers_and_complete(deployment: Deployment):
    d = deployment
    env = {"LATTICE_MODEL_LIMITS": json.dumps(LIMITS)}
    workers = [d.worker(TEAM_REF, "--concurrency", "20", env=env) for _ in range(2)]
    handles = [d.client.submit("e2e", plan(("worker", "handoff", f"t{i}"))) for i in range(3)]
    for i, handle in enumerate(handles):
        result = handle.wait(timeout=150)
        assert result.status == "completed", result
        assert result.result == f"final: done:worked[t{i}]"
    waits = []
    for handle in handles:
        events = list(d.client.events(handle.run_id, timeout=10))
        waits += [e for e in events if e.get("type") == "model_call_waiting"]
    # 12 calls at 3 at once and one a second: most waited, the long waits (over 1 s) ended their steps
    assert waits and {w["limit"] for w in waits} == {"requests_per_minute"}
    assert any(w["requeued"] for w in waits)
    logs = "".join(w.log() for w in workers)
    assert "'rate_limited'" in logs  # a step ended to wait (the task's outcome word)
    for task in ("t0", "t1", "t2"):
        assert d.executions(task) == 1  # nothing ran twice
    assert all(w.alive() for w in workers)
