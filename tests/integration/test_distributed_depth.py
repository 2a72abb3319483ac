"""Delegation depth in the distributed runtime holds as in one process
(``lattice_worker.team.depth``): a member in a worker works under its team's
``max_delegate_depth``, and a nested team's child run starts its lead at the
depth and under the limit of the member it serves. The step bodies run
in-process against the real Redis (``tests/support/inprocess.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from lattice_worker import (
    AssistantModelMessage,
    ModelRequest,
    ScriptedModelClient,
    agent_tool,
    create_team,
    define_agent,
    team_member,
    text_turn,
    tool_turn,
)
from tests.e2e.teams import lead_model, plan
from tests.support.inprocess import Cluster

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

HELPER_CALLS: list[str] = []


def _last_tool_result(request: ModelRequest) -> dict[str, Any] | None:
    content = request.messages[-1]["content"]
    if isinstance(content, list) and content and content[-1].get("type") == "tool_result":
        return content[-1]
    return None


def _helper_model(request: ModelRequest) -> AssistantModelMessage:
    HELPER_CALLS.append("called")
    return text_turn("helped")


def _asking_member_model(request: ModelRequest) -> AssistantModelMessage:
    """Asks its ``helper`` (an agent tool: one delegation deeper), then replies
    upstream with what came back (an answer, or the refusal)."""
    result = _last_tool_result(request)
    if result is None:
        return tool_turn(("helper", {"mode": "ask", "task": "help"}))
    if str(result["tool_use_id"]).startswith("reply"):
        return text_turn("replied")
    return tool_turn(("team_reply", {"content": str(result["content"])}, "reply-1"))


def _asking_member(name: str) -> Any:
    helper = define_agent(name="helper", model_client=ScriptedModelClient(_helper_model))
    spec = define_agent(
        name=name,
        model_client=ScriptedModelClient(_asking_member_model),
        tools=[agent_tool("helper", helper)],
        max_turns=6,
    )
    return team_member(name=name, agent=spec)


def _lead() -> Any:
    return define_agent(name="lead", model_client=ScriptedModelClient(lead_model), max_turns=6)


def flat_team(max_delegate_depth: int | None) -> Any:
    """Lead -> member ``worker`` (depth 1) -> its ``helper`` (depth 2)."""
    runner = {"max_delegate_depth": max_delegate_depth} if max_delegate_depth else None
    return create_team(name="depth_flat", lead=_lead(), members=[_asking_member("worker")], runner=runner)


def nested_company(max_delegate_depth: int) -> Any:
    """Lead -> member ``eng``, the team "depth_eng" (its lead at depth 1) -> its
    member ``backend`` (depth 2) -> ``helper`` (depth 3)."""
    eng = create_team(name="depth_eng", lead=_lead(), members=[_asking_member("backend")])
    return create_team(
        name="depth_co",
        lead=_lead(),
        members=[team_member(name="eng", agent=eng)],
        runner={"max_delegate_depth": max_delegate_depth},
    )


@pytest.fixture
async def cluster(prefix, monkeypatch):
    monkeypatch.setenv("LATTICE_KEY_PREFIX", prefix)
    HELPER_CALLS.clear()
    c = Cluster(prefix)
    yield c
    await c.close()


def _answer(record: Any) -> str:
    assert record.status.value == "completed", record
    return record.result.result


@pytest.mark.parametrize(("limit", "helped"), [(None, True), (2, True), (1, False)])
async def test_a_member_in_a_worker_works_under_its_teams_max_delegate_depth(cluster, limit, helped):
    worker = cluster.worker(flat_team(limit))
    run_id = await cluster.submit(worker, "depth_flat", plan(("worker", "handoff", "go")))
    await cluster.run(worker)
    answer = _answer(await worker.ctx.runs.get(run_id))
    if helped:
        assert answer == "final: done:helped" and HELPER_CALLS == ["called"]
    else:  # as in one process: the helper would run at depth 2, beyond 1
        assert "refused -- delegation depth limit reached" in answer
        assert "delegation depth 2, beyond max_delegate_depth=1" in answer
        assert HELPER_CALLS == []
    [task] = [m for m in await worker.ctx.mailbox.inbox("depth_flat::worker", "all")]
    assert task.metadata["delegate_depth"] == 1
    assert task.metadata["delegate_limit"] == (limit or 3)


@pytest.mark.parametrize(("limit", "helped"), [(3, True), (2, False)])
async def test_a_nested_teams_child_run_starts_at_its_members_depth_and_limit(cluster, limit, helped):
    worker = cluster.worker(nested_company(limit))  # serves the nested team "depth_eng" too
    inner = plan(("backend", "handoff", "build it"))  # the task for eng is the plan its lead follows
    run_id = await cluster.submit(worker, "depth_co", plan(("eng", "handoff", inner)))
    outcomes = await cluster.run(worker)
    assert "refused" not in outcomes and "unknown" not in outcomes
    answer = _answer(await worker.ctx.runs.get(run_id))
    [child_task] = await worker.ctx.mailbox.inbox("depth_eng::backend", "all")
    assert child_task.metadata["delegate_depth"] == 2  # one below the nested lead's depth 1
    assert child_task.metadata["delegate_limit"] == limit  # the company's, tighter than eng's default 3
    if helped:  # eng's report is the child run's answer, which holds backend's report
        assert answer == "final: done:final: done:helped" and HELPER_CALLS == ["called"]
    else:  # as in one process: the helper would run at depth 3, beyond the company's 2
        assert "delegation depth 3, beyond max_delegate_depth=2" in answer
        assert HELPER_CALLS == []
