"""End-to-end: token budgets with real ``lattice worker`` processes (issue 22, "Must show").

A run of the "e2e_budget" team (tests/e2e/budget_teams.py: every model call
reports 350 tokens) with a 2,000-token budget parks at ``budget_reached``,
never spends more than one call past the budget, and completes after
``raise_budget``. Its spend is the same on one worker process and on three.
So does a run of "e2e_budget_parallel", whose six work items run at once on
three worker processes.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.e2e.budget_teams import CALL_TOKENS, parallel_run_tokens, run_tokens
from tests.e2e.conftest import LATTICE, Deployment, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(240)]

TEAM_REF = "tests.e2e.budget_teams:team"
ASKS = 4
BUDGET = 2_000


def _status(d: Deployment, run_id: str) -> str:
    record = d.client.get_run(run_id)
    return record.status.value if record else "missing"


def _park_and_finish(d: Deployment, raise_with_cli: bool) -> tuple[int, int]:
    """Submit a run, wait until it parks, check it holds nothing, raise its
    budget, wait for its result: ``(spend at the park, final spend)``."""
    handle = d.client.submit(TEAM_REF, str(ASKS), budget={"tokens": BUDGET})
    wait_for(lambda: _status(d, handle.run_id) == "budget_reached", 60, "the run to park at its budget")
    parked = d.client.get_run(handle.run_id)
    # parked: no lease, no task waiting on any of the team's queues, nothing processing
    record_key = f"{d.prefix}:run:{{run:{handle.run_id}}}"
    assert not d.redis.hget(record_key, "lease_token")
    assert d.redis.zscore(f"{d.prefix}:runs:leased", handle.run_id) is None
    for queue in ("lead", "worker"):
        assert d.queue_length(f"{d.prefix}.e2e_budget.{queue}") == 0
    counts = d.client.status("e2e_budget").mailboxes
    assert all(not c.get("processing") for c in counts.values()), counts
    # at most the one call in flight past the budget
    assert BUDGET <= parked.spent_tokens < BUDGET + CALL_TOKENS, parked
    if raise_with_cli:
        argv = [LATTICE, "--key-prefix", d.prefix, "budget", handle.run_id, "--tokens", "20000"]
        done = subprocess.run(argv, env=d.env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert "resumed: the lead" in done.stdout, done.stdout
    else:
        raised = d.client.raise_budget(handle.run_id, tokens=20_000)
        assert raised.resumed_lead and raised.spent_tokens == parked.spent_tokens
    result = handle.wait(timeout=90)
    assert result.status == "completed", result
    assert result.result == "final: " + " | ".join(f"answer{k}" for k in range(ASKS))
    final = d.client.get_run(handle.run_id)
    events = list(d.client.events(handle.run_id, timeout=10))
    parks = [e for e in events if e.get("status") == "budget_reached"]
    assert [p["budget"] for p in parks] == [{"tokens": BUDGET}]
    assert parks[0]["spent_tokens"] == parked.spent_tokens
    return parked.spent_tokens, final.spent_tokens


def test_a_budgeted_run_parks_resumes_and_spends_the_same_on_one_worker_and_on_three(deployment):
    d = deployment
    first = d.worker(TEAM_REF, "--concurrency", "1")
    one = _park_and_finish(d, raise_with_cli=False)
    more = [d.worker(TEAM_REF, "--concurrency", "1") for _ in range(2)]
    three = _park_and_finish(d, raise_with_cli=True)
    assert one == three == (6 * CALL_TOKENS, run_tokens(ASKS))
    assert all(p.alive() for p in [first, *more])


def test_parallel_members_on_three_workers_spend_at_most_one_call_past_the_budget(deployment):
    d = deployment
    ref = "tests.e2e.budget_teams:parallel_team"
    workers = [d.worker(ref) for _ in range(3)]
    handle = d.client.submit(ref, "6", budget={"tokens": BUDGET})
    wait_for(lambda: _status(d, handle.run_id) == "budget_reached", 60, "the run to park at its budget")

    # the items' calls overlap across the processes; parked members hold nothing
    def members_idle() -> bool:
        counts = d.client.status("e2e_budget_parallel").mailboxes
        return not any(c.get("processing") for c in counts.values())

    wait_for(members_idle, 30, "the members to park")
    parked = d.client.get_run(handle.run_id)
    assert parked.status.value == "budget_reached", parked
    assert BUDGET <= parked.spent_tokens < BUDGET + CALL_TOKENS, parked
    raised = d.client.raise_budget(handle.run_id, tokens=50_000)
    assert raised.resumed_messages, raised
    result = handle.wait(timeout=90)
    assert result.status == "completed", result
    assert result.result == "final: " + " | ".join(f"answer{k}" for k in range(6))
    assert d.client.get_run(handle.run_id).spent_tokens == parallel_run_tokens(6)
    assert all(p.alive() for p in workers)
