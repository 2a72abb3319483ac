"""The distributed runtime's suspend/resume protocol, in-process, against the real Redis.

The task *bodies* (``lead_segment.run_lead``, ``member_step.deliver``,
``lead_segment.resume_lead``) run in the test's event loop; the tasks they would
enqueue are collected by a fake sender and run by the test ("the broker"), in
order or concurrently. Every test has its own key prefix; its keys are deleted
afterwards.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

import pytest
import redis

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK
from lattice_client.runstore import RunStore
from lattice_mailbox.redis import RedisMailbox
from lattice_worker.errors import ConfigError
from lattice_worker.runtime.lead import dispatch as lead_dispatch
from lattice_worker.runtime.lead import end as run_end
from lattice_worker.runtime.lead import segment as lead_segment
from lattice_worker.runtime.member import step as member_step
from lattice_worker.runtime.reaper import sweep as reaper
from lattice_worker.runtime.run.context import WorkerContext
from lattice_worker.runtime.worker.registry import TeamRegistry
from lattice_worker.team.reports import parse_report_message
from tests.e2e import teams
from tests.e2e.teams import plan
from tests.support.services import REDIS_URL, settings_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
def prefix(monkeypatch):
    name = f"test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("LATTICE_KEY_PREFIX", name)
    yield name
    sync = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(sync.scan_iter(match=f"{name}:*", count=1000))
        if keys:
            sync.delete(*keys)
    finally:
        sync.close()


class Broker:
    """Collects the tasks the bodies enqueue and runs them."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.queue: list[tuple[str, list[Any], str]] = []
        self.log: list[tuple[str, Any, str]] = []

    def send(self, name: str, args: list[Any], queue: str) -> None:
        self.queue.append((name, args, queue))

    async def run_one(self, name: str, args: list[Any]) -> str:
        if name == RUN_LEAD_TASK:
            out = await lead_segment.run_lead(self.ctx, args[0])
        elif name == DELIVER_TASK:
            out = await member_step.deliver(self.ctx, *args)
        elif name == RESUME_LEAD_TASK:
            out = await lead_segment.resume_lead(self.ctx, args[0])
        else:  # pragma: no cover
            raise AssertionError(name)
        self.log.append((name, args[0], out))
        return out

    async def drain(self, *, concurrent: bool = False, limit: int = 200) -> None:
        """Run queued tasks until none is left (all of a wave at once when ``concurrent``)."""
        for _ in range(limit):
            if not self.queue:
                return
            if concurrent:
                wave, self.queue = self.queue, []
                await asyncio.gather(*(self.run_one(n, a) for n, a, _ in wave))
            else:
                name, args, _ = self.queue.pop(0)
                await self.run_one(name, args)
        raise AssertionError("tasks kept coming")


@pytest.fixture
async def env(prefix):
    settings = settings_for(prefix, lease_seconds=5, max_attempts=2, reaper_interval_seconds=0.2)
    mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
    registry = TeamRegistry(mailbox)
    for ref in ("tests.e2e.teams:team", "tests.e2e.teams:session_team", "tests.e2e.teams:nested_team"):
        registry.load(ref)
    runs = RunStore(REDIS_URL, prefix)
    broker = Broker(None)
    ctx = WorkerContext(
        settings=settings, registry=registry, mailbox=mailbox, runs=runs, send_task=broker.send
    )
    broker.ctx = ctx
    yield ctx, broker
    await runs.aclose()
    await mailbox.aclose()


async def submit(ctx: WorkerContext, broker: Broker, team: str, prompt: str) -> str:
    run_id = f"run_{uuid.uuid4().hex[:10]}"
    await ctx.runs.create(run_id, team, prompt)
    broker.send(RUN_LEAD_TASK, [run_id], f"{ctx.prefix}.{team}.lead")
    return run_id


def executions(raw: redis.Redis, prefix: str, task: str) -> int:
    return int(raw.get(f"{prefix}:test:exec:{task}") or 0)


async def all_messages(ctx: WorkerContext, team: str) -> list[Any]:
    out = []
    for box in await ctx.mailbox.mailbox_ids(f"{team}::"):
        out += await ctx.mailbox.inbox(box, "all")
    return out


async def test_handoffs_suspend_then_resume_with_reports_in_handoff_order(env, raw, prefix):
    ctx, broker = env
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "a"), ("other", "handoff", "b")))
    name, args, _ = broker.queue.pop(0)
    assert await broker.run_one(name, args) == "suspended"
    record = await ctx.runs.get(run_id)
    assert record.status.value == "suspended"
    # both doorbells rung, on the members' own queues; no resume yet
    assert sorted((n, q) for n, _, q in broker.queue) == [
        (DELIVER_TASK, f"{prefix}.e2e.other"),
        (DELIVER_TASK, f"{prefix}.e2e.worker"),
    ]
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    assert record.result.result == "final: done:worked[a] | done:worked[b]"
    # the lead saw one report message with both reports, in handoff order
    history = [json.loads(x) for x in raw.lrange(ctx.keys.history(run_id), 0, -1)]
    reports = [parse_report_message(m) for m in history if parse_report_message(m)]
    assert [[e["member"] for e in r] for r in reports] == [["worker", "other"]]
    # every message of the run is done (tasks, replies consumed by the lead)
    assert {m.status.value for m in await all_messages(ctx, "e2e")} == {"done"}
    assert [n for n, _, _ in broker.log].count(RESUME_LEAD_TASK) == 1
    # the event stream carries team events and ends with the run_result
    events = [e for _, e in await ctx.runs.events(run_id, count=1000)]
    types = [e["type"] for e in events]
    assert types[-1] == "run_result" and types[-2] == "result"
    assert {"team_message", "team_agent", "agent_message", "assistant", "run_status"} <= set(types)


async def test_ask_result_fills_the_tool_result(env, raw, prefix):
    ctx, broker = env
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "ask", "q1"), ("other", "handoff", "h1")))
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.result.result == "final: ask:worked[q1] | done:worked[h1]"
    history = [json.loads(x) for x in raw.lrange(ctx.keys.history(run_id), 0, -1)]
    ask_blocks = [
        b
        for m in history
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result" and b["tool_use_id"] == "toolu_0_worker"
    ]
    assert [b["content"] for b in ask_blocks] == ["worked[q1]"]
    assert "lattice: member" not in json.dumps(history)  # no placeholder left


async def test_failed_member_is_isolated_and_reported(env, raw, prefix):
    ctx, broker = env
    run_id = await submit(
        ctx, broker, "e2e", plan(("worker", "handoff", "x fail"), ("other", "handoff", "ok"))
    )
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    assert record.result.result.startswith("final: failed:")
    assert record.result.result.endswith("| done:worked[ok]")
    statuses = {m.content.split()[0]: m.status.value for m in await ctx.mailbox.inbox("e2e::worker", "all")}
    assert statuses == {"x": "failed"}


async def test_members_run_concurrently_and_the_last_completion_resumes_once(env, raw, prefix):
    ctx, broker = env
    run_id = await submit(
        ctx, broker, "e2e", plan(*[("worker", "handoff", f"t{i} barrier=4") for i in range(4)])
    )
    await broker.drain(concurrent=True)
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    assert record.result.result.count("done:") == 4
    assert [n for n, _, _ in broker.log].count(RESUME_LEAD_TASK) == 1
    log = raw.lrange(f"{prefix}:test:log", 0, -1)
    # all four started before the first ended: they overlapped
    assert [x.split(":")[0] for x in log[:4]] == ["start"] * 4


async def test_max_concurrent_work_items_bounds_dispatch(env, raw, prefix):
    ctx, broker = env
    team = ctx.registry.get("e2e")
    object.__setattr__(team.runner_options, "max_concurrent_work_items", 1)
    try:
        run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "a"), ("other", "handoff", "b")))
        name, args, _ = broker.queue.pop(0)
        await broker.run_one(name, args)
        assert [q for _, _, q in broker.queue] == [f"{prefix}.e2e.worker"]  # only the first may start
        await broker.drain(concurrent=True)
    finally:
        object.__setattr__(team.runner_options, "max_concurrent_work_items", 4)
    record = await ctx.runs.get(run_id)
    assert record.result.result == "final: done:worked[a] | done:worked[b]"
    assert raw.lrange(f"{prefix}:test:log", 0, -1) == ["start:a", "end:a", "start:b", "end:b"]


async def test_max_concurrent_work_items_holds_per_run_when_runs_share_a_member(env, raw, prefix):
    ctx, broker = env
    team = ctx.registry.get("e2e")
    object.__setattr__(team.runner_options, "max_concurrent_work_items", 1)
    try:
        runs = {}
        for run in ("r1", "r2"):
            tasks = [("worker", "handoff", f"{run}-{i} sleep=0.3") for i in range(3)]
            runs[run] = await submit(ctx, broker, "e2e", plan(*tasks))
        for _ in runs:
            name, args, _ = broker.queue.pop(0)
            assert await broker.run_one(name, args) == "suspended"
        # one mailbox, six pending messages: r1-0 r1-1 r1-2 r2-0 r2-1 r2-2; two doorbells
        assert len(await ctx.mailbox.inbox("e2e::worker")) == 6 and len(broker.queue) == 2
        await broker.drain(concurrent=True)
    finally:
        object.__setattr__(team.runner_options, "max_concurrent_work_items", 4)
    for run_id in runs.values():
        record = await ctx.runs.get(run_id)
        assert record.result.result.count("done:") == 3, record.result
    # what the member's tool saw: never two items of one run at once, the two runs side by side
    running: dict[str, int] = {"r1": 0, "r2": 0}
    most = 0
    for entry in raw.lrange(f"{prefix}:test:log", 0, -1):
        what, task = entry.split(":", 1)
        running[task[:2]] += 1 if what == "start" else -1
        assert running[task[:2]] <= 1, raw.lrange(f"{prefix}:test:log", 0, -1)
        most = max(most, sum(running.values()))
    assert most == 2


async def test_a_doorbell_without_a_message_never_claims_an_item_its_run_still_queues(env, raw, prefix):
    ctx, broker = env
    team = ctx.registry.get("e2e")
    object.__setattr__(team.runner_options, "max_concurrent_work_items", 1)
    try:
        run_id = await submit(
            ctx, broker, "e2e", plan(("worker", "handoff", "a"), ("worker", "handoff", "b"))
        )
        name, args, _ = broker.queue.pop(0)
        await broker.run_one(name, args)
        [(_, [box, first_id], _)] = broker.queue
        broker.queue.clear()
        first, second = await ctx.mailbox.inbox("e2e::worker")
        assert first.id == first_id
        assert await member_step.startable(ctx, "e2e::worker") == [first.id]
        # a live worker has the first one; a doorbell rung again (the reaper's) finds nothing to start
        await ctx.mailbox.claim_next(box, message_id=first.id, lease_s=30, worker_id="alive")
        assert await member_step.deliver(ctx, "e2e::worker") == "idle"
        assert [m.id for m in await ctx.mailbox.inbox("e2e::worker")] == [second.id]
        await ctx.mailbox.send("e2e::lead", "e2e::worker", "not a work item")  # no run: it may start
        assert len(await member_step.startable(ctx, "e2e::worker")) == 1
    finally:
        object.__setattr__(team.runner_options, "max_concurrent_work_items", 4)
    assert [it["state"] for it in await ctx.runs.items(run_id)] == ["dispatched", "queued"]


async def test_duplicate_doorbells_and_tasks_never_execute_twice(env, raw, prefix, caplog):
    ctx, broker = env
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "once")))
    # duplicate run_lead
    broker.queue.append(broker.queue[0])
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    # more doorbells and a duplicated resume afterwards: all no-ops
    assert await member_step.deliver(ctx, "e2e::worker") == "idle"
    with caplog.at_level(logging.INFO, logger="lattice_worker.runtime"):
        assert await lead_segment.resume_lead(ctx, run_id) == "skipped"
        assert await lead_segment.run_lead(ctx, run_id) == "skipped"
    said = [r.getMessage() for r in caplog.records if "nothing to do" in r.getMessage()]
    assert said[-2:] == [
        f"resume_lead: run {run_id} is completed, not resuming; nothing to do",
        f"run_lead: run {run_id} is completed, not queued; nothing to do",
    ]
    assert executions(raw, prefix, "once") == 1
    outcomes = [out for n, _, out in broker.log if n == RUN_LEAD_TASK]
    assert sorted(outcomes) == ["skipped", "suspended"]


async def test_cancelled_run_messages_are_cancelled_not_run(env, raw, prefix):
    ctx, broker = env
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "never")))
    name, args, _ = broker.queue.pop(0)
    await broker.run_one(name, args)
    await ctx.runs.cancel(run_id)  # the client also cancels the messages; here the worker must
    await broker.drain()
    assert executions(raw, prefix, "never") == 0
    [message] = await ctx.mailbox.inbox("e2e::worker", "all")
    assert message.status.value == "cancelled"
    assert (await ctx.runs.get(run_id)).status.value == "cancelled"
    assert await lead_segment.resume_lead(ctx, run_id) == "skipped"


async def test_session_member_is_serial_and_keeps_its_history(env, raw, prefix):
    ctx, broker = env
    run_id = await submit(
        ctx, broker, "e2e_session", plan(("clerk", "handoff", "one sleep=0.05"), ("clerk", "handoff", "two"))
    )
    await broker.drain(concurrent=True)
    record = await ctx.runs.get(run_id)
    assert record.result.result == "final: done:worked[one sleep=0.05] | done:worked[two]"
    assert raw.lrange(f"{prefix}:test:log", 0, -1) == [
        "start:one sleep=0.05",
        "end:one sleep=0.05",
        "start:two",
        "end:two",
    ]
    # the session's conversation holds both work items, persisted per mailbox
    session = [json.loads(x) for x in raw.lrange(ctx.keys.session("e2e_session::clerk"), 0, -1)]
    prompts = [m for m in session if m["role"] == "user" and isinstance(m["content"], str)]
    assert len(prompts) == 2


async def test_nested_team_runs_as_a_child_run_and_replies_upstream(env, raw, prefix):
    ctx, broker = env
    inner = plan(("backend", "handoff", "build api"))
    run_id = await submit(ctx, broker, "e2e_company", plan(("eng", "handoff", inner)))
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    assert record.result.result == "final: done:final: done:worked[build api]"
    children = [r for r in await ctx.runs.list_runs("e2e_eng")]
    assert len(children) == 1 and children[0].parent.run_id == run_id
    assert children[0].status.value == "completed"
    # the child's events also reach the root run's stream, wrapped
    events = [e for _, e in await ctx.runs.events(run_id, count=1000)]
    wrapped = [e for e in events if e["type"] == "agent_message" and e["member"] == "eng"]
    assert any(
        e["message"]["type"] == "result" and e["message"]["result"].startswith("final:") for e in wrapped
    )
    assert {m.status.value for m in await all_messages(ctx, "e2e_company")} == {"done"}


async def test_expired_lease_is_requeued_and_past_max_attempts_fails_upstream(env, raw, prefix):
    ctx, broker = env
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "lost")))
    name, args, _ = broker.queue.pop(0)
    await broker.run_one(name, args)
    broker.queue.clear()
    # two workers "die" right after claiming (max_attempts=2)
    for attempt in (1, 2):
        claimed = await ctx.mailbox.claim_next("e2e::worker", lease_s=0.05, worker_id=f"dead-{attempt}")
        assert claimed.attempts == attempt
        await asyncio.sleep(0.1)
        report = await reaper.sweep(ctx, force=True)
        if attempt == 1:
            assert report.requeued == [claimed.id]
            assert [q for _, _, q in broker.queue] == [f"{prefix}.e2e.worker"]  # doorbell rung
            broker.queue.clear()
        else:
            assert report.failed == [claimed.id]
    # the work item failed with a diagnostic upstream and the lead resumed
    assert RESUME_LEAD_TASK in [n for n, _, _ in broker.queue]
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    assert record.result.result.startswith("final: failed:")
    assert "max_attempts" in record.result.result
    [message] = await ctx.mailbox.inbox("e2e::worker", "all")
    assert message.status.value == "failed" and message.attempts == 2
    assert executions(raw, prefix, "lost") == 0


async def test_reaper_rerings_a_lost_doorbell_once_per_lease(env, raw, prefix):
    ctx, broker = env
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.1)
    await ctx.mailbox.send("e2e::lead", "e2e::worker", "orphan")
    await asyncio.sleep(0.15)
    first = await reaper.sweep(ctx, force=True)
    second = await reaper.sweep(ctx, force=True)
    assert first.rerung == ["e2e::worker"]
    assert second.rerung == []
    assert [(n, a) for n, a, _ in broker.queue] == [(DELIVER_TASK, ["e2e::worker"])]


async def test_only_one_reaper_sweeps_at_a_time(env, prefix):
    ctx, _ = env
    other = WorkerContext(
        settings=ctx.settings,
        registry=ctx.registry,
        mailbox=ctx.mailbox,
        runs=ctx.runs,
        send_task=ctx.send_task,
    )
    results = await asyncio.gather(reaper.sweep(ctx, interval_s=5), reaper.sweep(other, interval_s=5))
    assert sorted(r is None for r in results) == [False, True]
    # the lock stays for the interval: the next sweep is refused too
    assert await reaper.sweep(ctx, interval_s=5) is None


async def test_registry_refuses_a_live_agent_lead():
    from lattice_worker import ScriptedModelClient, create_agent
    from lattice_worker.team import create_team

    team = create_team(name="live_lead", lead=create_agent(model_client=ScriptedModelClient([])))
    registry = TeamRegistry(object())
    with pytest.raises(ConfigError, match="lead must be an AgentSpec"):
        registry.add(team)


async def test_registry_loads_nested_teams_and_lists_queues(env, prefix):
    ctx, _ = env
    registry = ctx.registry
    assert {"e2e", "e2e_session", "e2e_company", "e2e_eng"} <= set(registry.names())
    assert registry.get("e2e").mailbox is ctx.mailbox
    assert teams.team.mailbox is not ctx.mailbox  # the definition itself is untouched
    reg = TeamRegistry(ctx.mailbox)
    reg.load("tests.e2e.teams:nested_team")
    assert reg.queues("p") == [
        "p.e2e_company.lead",
        "p.e2e_company.eng",
        "p.e2e_eng.lead",
        "p.e2e_eng.backend",
    ]
    assert reg.queues("p", ["lead"]) == ["p.e2e_company.lead", "p.e2e_eng.lead"]
    with pytest.raises(ConfigError, match="unknown member"):
        reg.queues("p", ["nobody"])
    with pytest.raises(ConfigError, match="cannot import"):
        reg.load("no_such_module_xyz:team")
    with pytest.raises(ConfigError, match="unknown team"):
        reg.load("not-registered")


async def test_every_follow_up_step_goes_through_the_broker(env, raw, prefix):
    from lattice_worker.runtime.worker.tasks import run_step

    ctx, broker = env
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "a"), ("other", "ask", "b")))
    broker.queue.pop(0)
    # the lead's task ends at the suspension: the doorbells are tasks of their own
    assert await run_step(ctx, RUN_LEAD_TASK, run_id) == "suspended"
    [a_message] = await ctx.mailbox.inbox("e2e::worker")
    [b_message] = await ctx.mailbox.inbox("e2e::other")
    assert [(n, a) for n, a, _ in broker.queue] == [  # each the doorbell of its work item's message
        (DELIVER_TASK, ["e2e::worker", a_message.id]),
        (DELIVER_TASK, ["e2e::other", b_message.id]),
    ]
    assert executions(raw, prefix, "a") == 0 and executions(raw, prefix, "b") == 0
    record = await ctx.runs.get(run_id)
    assert record.status.value == "suspended"
    # the step's writes are stored by the end of its task, before anyone takes the doorbells
    types = [e["type"] for _, e in await ctx.runs.events(run_id, count=1000)]
    assert types[-1] == "run_status" and "agent_message" not in types
    # each member step enqueues nothing but, for the last one, the resume
    name, args, _ = broker.queue.pop(0)
    assert await run_step(ctx, name, *args) == "done"
    assert broker.queue == [(DELIVER_TASK, ["e2e::other", b_message.id], f"{prefix}.e2e.other")]
    name, args, _ = broker.queue.pop(0)
    assert await run_step(ctx, name, *args) == "done"
    assert broker.queue == [(RESUME_LEAD_TASK, [run_id], f"{prefix}.e2e.lead")]
    name, args, _ = broker.queue.pop(0)
    assert await run_step(ctx, name, args[0]) == "completed"
    record = await ctx.runs.get(run_id)
    assert record.result.result == "final: ask:worked[b] | done:worked[a]"
    assert broker.queue == []
    assert executions(raw, prefix, "a") == 1 and executions(raw, prefix, "b") == 1
    assert raw.zscore(ctx.runs.leases_key, run_id) is None


async def test_a_child_run_stops_when_its_parent_run_was_cancelled(env, raw, prefix):
    ctx, broker = env
    inner = plan(("backend", "handoff", "slow part"))
    run_id = await submit(ctx, broker, "e2e_company", plan(("eng", "handoff", inner)))
    # run until the child run waits for its backend member
    while broker.queue and not any(q.endswith(".e2e_eng.backend") for _, _, q in broker.queue):
        name, args, _ = broker.queue.pop(0)
        await broker.run_one(name, args)
    [child] = await ctx.runs.list_runs("e2e_eng")
    assert child.status.value == "suspended"
    assert await run_end.cancel_run(ctx, run_id, "stop") != []  # the eng message, as the client does
    await broker.drain()
    assert (await ctx.runs.get(child.run_id)).status.value == "cancelled"
    assert (await ctx.runs.get(run_id)).status.value == "cancelled"
    [eng_message] = await ctx.mailbox.inbox("e2e_company::eng", "all")
    assert eng_message.status.value == "cancelled"
    # nothing was replied upstream to the cancelled parent
    assert [m.status.value for m in await ctx.mailbox.inbox("e2e_company::lead", "all")] == []


async def test_the_lease_is_renewed_while_the_member_works(env, raw, prefix):
    ctx, broker = env
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.3)
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "long sleep=1.2")))
    name, args, _ = broker.queue.pop(0)
    await broker.run_one(name, args)
    stop = asyncio.Event()
    requeued: list[str] = []

    async def reaper_loop() -> None:
        while not stop.is_set():
            report = await reaper.sweep(ctx, force=True)
            requeued.extend(report.requeued + report.failed)
            await asyncio.sleep(0.05)

    sweeper = asyncio.create_task(reaper_loop())
    try:
        assert await member_step.deliver(ctx, "e2e::worker") == "done"
    finally:
        stop.set()
        await sweeper
    assert requeued == []  # four leases long, never expired
    [message] = await ctx.mailbox.inbox("e2e::worker", "all")
    assert (message.status.value, message.attempts) == ("done", 1)
    await broker.drain()
    assert (await ctx.runs.get(run_id)).result.result == "final: done:worked[long sleep=1.2]"


async def test_a_member_that_lost_its_claim_is_aborted_and_its_outcome_discarded(env, raw, prefix):
    ctx, broker = env
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.3)
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "slow sleep=1")))
    name, args, _ = broker.queue.pop(0)
    await broker.run_one(name, args)
    broker.queue.clear()
    first = asyncio.create_task(member_step.deliver(ctx, "e2e::worker"))
    await asyncio.sleep(0.1)  # the member is working (sleeping in its tool)
    # the store expires the claim (as if renewals had stalled) and another worker re-claims
    moved = await ctx.mailbox.requeue_expired(now_ms=2**50)
    assert [m.status.value for m in moved] == ["pending"]
    successor = await ctx.mailbox.claim_next("e2e::worker", lease_s=30, worker_id="successor")
    assert successor.attempts == 2
    assert await first == "lost"
    # the first worker wrote nothing: the message is still the successor's, no reply upstream
    current = await ctx.mailbox.get(successor.id)
    assert (current.status.value, current.claimed_by) == ("processing", "successor")
    assert await ctx.mailbox.inbox("e2e::lead", "all") == []
    assert [it["outcome"] for it in await ctx.runs.items(run_id)] == [None]


async def test_an_item_finished_before_its_run_registered_it_still_completes(env, raw, prefix, monkeypatch):
    """Another worker's doorbell may claim a task message the moment it is sent,
    while the lead's tool batch is still running (before the item is in the wait set)."""
    ctx, broker = env
    original = lead_dispatch.dispatch_items

    async def claimed_in_between(ctx_, run_id, team, items, **kwargs):
        for item in items:  # another worker got there first
            assert await member_step.deliver(ctx_, item["mailbox_id"]) == "done"
        await original(ctx_, run_id, team, items, **kwargs)

    monkeypatch.setattr(lead_dispatch, "dispatch_items", claimed_in_between)
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "early"), ("other", "ask", "eager")))
    name, args, _ = broker.queue.pop(0)
    # the lead registers and suspends in one write, then finds both items already
    # finished: it completes them as their members would have, which wakes the run
    assert await broker.run_one(name, args) == "suspended"
    assert RESUME_LEAD_TASK in [n for n, _, _ in broker.queue]
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.result.result == "final: ask:worked[eager] | done:worked[early]"
    [message] = await ctx.mailbox.inbox("e2e::worker", "all")
    assert message.metadata["run_id"] == run_id  # linked before it was sent
    assert executions(raw, prefix, "early") == 1


async def test_reaper_re_enqueues_a_resume_left_behind_by_a_dead_worker(env, raw, prefix):
    ctx, broker = env
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.1)
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "a")))
    name, args, _ = broker.queue.pop(0)
    await broker.run_one(name, args)
    await member_step.deliver(ctx, "e2e::worker")
    # the worker that was to resume the run died: the enqueued resume is gone
    assert [n for n, _, _ in broker.queue] == [DELIVER_TASK, RESUME_LEAD_TASK]
    broker.queue.clear()
    assert (await ctx.runs.get(run_id)).status.value == "resuming"
    await asyncio.sleep(0.15)
    first = await reaper.sweep(ctx, force=True)
    second = await reaper.sweep(ctx, force=True)
    assert (first.resumed, second.resumed) == ([run_id], [])
    await broker.drain()
    assert (await ctx.runs.get(run_id)).result.result == "final: done:worked[a]"


# -- lead leases: a worker dying during a lead turn (issue 6, architecture.md "Crash") ----


class Gate:
    """Blocks the first ``times`` callers at :meth:`wait` until released (a frozen
    worker); later callers pass at once."""

    def __init__(self, times: int = 1) -> None:
        self.times = times
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def wait(self) -> None:
        self.calls += 1
        if self.calls <= self.times:
            self.reached.set()
            await self.release.wait()


@pytest.fixture
def frozen_leases(monkeypatch):
    """While ``state["frozen"]``, new lead leases never renew (their worker is
    stuck or dead); leases made afterwards renew normally."""
    from lattice_worker.runtime.lead.lease import LeadLease

    state = {"frozen": True}
    original = LeadLease._run

    async def run(self):
        if state["frozen"]:
            await asyncio.Event().wait()
        await original(self)

    monkeypatch.setattr(LeadLease, "_run", run)
    return state


def hold_send(monkeypatch, gate: Gate, word: str, to_box: str | None = None) -> None:
    """Block the lead's member call whose task contains ``word`` (sent to
    ``to_box`` when given) before anything of it is written (journal, link, message)."""
    original = lead_dispatch.RunLinkingMailbox.send

    async def send(self, from_, to, content, **kwargs):
        if word in content and to_box in (None, to):
            await gate.wait()
        return await original(self, from_, to, content, **kwargs)

    monkeypatch.setattr(lead_dispatch.RunLinkingMailbox, "send", send)


async def expire_and_sweep(ctx: WorkerContext) -> reaper.SweepReport:
    await asyncio.sleep(ctx.settings.lease_seconds + 0.1)
    return await reaper.sweep(ctx, force=True)


async def one_message_each(ctx: WorkerContext, *boxes: str) -> dict[str, list[tuple[str, int]]]:
    return {box: [(m.status.value, m.attempts) for m in await ctx.mailbox.inbox(box, "all")] for box in boxes}


@pytest.mark.parametrize("death", ["between_member_calls", "before_registration", "before_suspension"])
async def test_a_lead_turn_whose_worker_died_is_recovered_without_duplicating_member_work(
    env, raw, prefix, monkeypatch, frozen_leases, death
):
    ctx, broker = env
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.3)
    gate = Gate()
    if death == "between_member_calls":  # a1 sent (journaled, not registered), b1 not yet
        hold_send(monkeypatch, gate, "b1")
    elif death == "before_registration":  # both sent, tool results stored, items not registered
        original_dispatch = lead_dispatch.dispatch_items

        async def dispatch(*args, **kwargs):
            await args[0].writer.flush()  # the tool results are stored (queued, they go with the next write)
            await gate.wait()
            return await original_dispatch(*args, **kwargs)

        monkeypatch.setattr(lead_dispatch, "dispatch_items", dispatch)
    else:  # items registered, the run not suspended yet (the suspension goes with the
        # registration's write: the worker died before that part reached Redis)
        suspend_sha = ctx.runs.suspend_call("any")[0][1]
        original_write = ctx.writer.write

        async def write(commands, **kwargs):
            held = [c for c in commands if c[:2] == ("evalsha", suspend_sha)]
            if not held:
                return await original_write(commands, **kwargs)
            replies = await original_write([c for c in commands if c not in held], **kwargs)
            await gate.wait()
            return replies + await original_write(held, **kwargs)

        monkeypatch.setattr(ctx.writer, "write", write)
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "a1"), ("other", "ask", "b1")))
    name, args, _ = broker.queue.pop(0)
    stale = asyncio.create_task(broker.run_one(name, args))
    await gate.reached.wait()
    history_before = raw.llen(ctx.keys.history(run_id))
    if death == "before_registration":  # the recovery finds the tool results stored
        assert json.loads(raw.lindex(ctx.keys.history(run_id), -1))["role"] == "user"
    assert (await ctx.runs.get(run_id)).status.value == "running"

    report = await expire_and_sweep(ctx)
    assert report.recovered == [run_id]
    assert (await ctx.runs.get(run_id)).status.value == "resuming"
    assert (RESUME_LEAD_TASK, [run_id], f"{prefix}.e2e.lead") in broker.queue
    frozen_leases["frozen"] = False
    await broker.drain()

    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed", record
    assert record.result.result == "final: ask:worked[b1] | done:worked[a1]"
    assert executions(raw, prefix, "a1") == 1 and executions(raw, prefix, "b1") == 1
    assert await one_message_each(ctx, "e2e::worker", "e2e::other") == {
        "e2e::worker": [("done", 1)],
        "e2e::other": [("done", 1)],
    }
    assert {m.status.value for m in await ctx.mailbox.inbox("e2e::lead", "all")} == {"done"}
    events = [e for _, e in await ctx.runs.events(run_id, count=1000)]
    assert {"type": "run_status", "status": "recovering", "run_id": run_id, "attempt": 2} in events
    history = [json.loads(x) for x in raw.lrange(ctx.keys.history(run_id), 0, -1)]
    assert len(history) >= history_before
    # one assistant turn with the member calls, one tool_result message for it
    assert sum(1 for m in history if m["role"] == "assistant" and "tool_use" in json.dumps(m)) == 1

    # the stale worker comes back: every write it tries is refused, nothing changes
    gate.release.set()
    assert await stale == "lost"
    assert raw.lrange(ctx.keys.history(run_id), 0, -1) == [
        json.dumps(m, separators=(",", ":")) for m in history
    ]
    assert (await ctx.runs.get(run_id)).result == record.result
    assert executions(raw, prefix, "a1") == 1 and executions(raw, prefix, "b1") == 1
    assert [len(await ctx.mailbox.inbox(box, "all")) for box in ("e2e::worker", "e2e::other")] == [1, 1]


async def test_a_member_call_journaled_but_never_sent_is_sent_once_under_its_work_item(
    env, raw, prefix, monkeypatch, frozen_leases
):
    ctx, broker = env
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.3)
    gate = Gate()
    original = ctx.mailbox.send

    async def send(from_, to, content, **kwargs):  # the worker dies inside the mailbox write
        if "b2" in content:
            await gate.wait()
        return await original(from_, to, content, **kwargs)

    monkeypatch.setattr(ctx.mailbox, "send", send)
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "a2"), ("other", "handoff", "b2")))
    name, args, _ = broker.queue.pop(0)
    dead = asyncio.create_task(broker.run_one(name, args))
    await gate.reached.wait()
    journal = await ctx.runs.journal(run_id)
    assert sorted(journal) == ["toolu_0_worker", "toolu_1_other"]
    assert await ctx.mailbox.inbox("e2e::other", "all") == []
    assert (await expire_and_sweep(ctx)).recovered == [run_id]
    # kill -9: nothing more of that worker runs (what its cancellation still tries
    # to write -- "withheld" tool results -- is refused: its lease is gone)
    dead.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dead
    frozen_leases["frozen"] = False
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.result.result == "final: done:worked[a2] | done:worked[b2]"
    [b2] = await ctx.mailbox.inbox("e2e::other", "all")
    assert b2.work_item_id == journal["toolu_1_other"]["work_item_id"]  # the journaled item, sent once
    assert executions(raw, prefix, "a2") == 1 and executions(raw, prefix, "b2") == 1
    assert await ctx.runs.journal(run_id) == {}


async def test_a_lead_that_keeps_dying_fails_past_max_attempts_and_its_sent_work_is_cancelled(
    env, raw, prefix, monkeypatch, frozen_leases
):
    ctx, broker = env  # max_attempts=2
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.3)
    gate = Gate(times=2)
    hold_send(monkeypatch, gate, "b3")
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "a3"), ("other", "handoff", "b3")))
    name, args, _ = broker.queue.pop(0)
    first = asyncio.create_task(broker.run_one(name, args))
    await gate.reached.wait()
    assert (await expire_and_sweep(ctx)).recovered == [run_id]
    broker.queue.clear()
    gate.reached.clear()
    second = asyncio.create_task(lead_segment.resume_lead(ctx, run_id))  # dies at the same point
    await gate.reached.wait()
    report = await expire_and_sweep(ctx)
    assert (report.recovered, report.failed_runs) == ([], [run_id])
    record = await ctx.runs.get(run_id)
    assert record.status.value == "failed"
    assert "started 2 time(s)" in record.result.error and "max_attempts is 2" in record.result.error
    events = [e for _, e in await ctx.runs.events(run_id, count=1000)]
    assert events[-1]["type"] == "run_result" and events[-1]["status"] == "failed"
    # a3 was sent once (the second segment reused it) and is cancelled, never run
    assert await one_message_each(ctx, "e2e::worker", "e2e::other") == {
        "e2e::worker": [("cancelled", 0)],
        "e2e::other": [],
    }
    assert await member_step.deliver(ctx, "e2e::worker") == "idle"
    gate.release.set()
    assert await first == "lost" and await second == "lost"
    assert executions(raw, prefix, "a3") == 0 and executions(raw, prefix, "b3") == 0
    assert await ctx.mailbox.inbox("e2e::other", "all") == []


async def test_a_child_run_whose_worker_died_recovers_and_completes_the_parent_message(
    env, raw, prefix, monkeypatch, frozen_leases
):
    ctx, broker = env
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.3)
    gate = Gate()
    hold_send(monkeypatch, gate, "build api", "e2e_eng::backend")
    inner = plan(("backend", "handoff", "build api"))
    run_id = await submit(ctx, broker, "e2e_company", plan(("eng", "handoff", inner)))
    # run until the child run's lead task is next
    while not any(q.endswith(".e2e_eng.lead") for _, _, q in broker.queue):
        name, args, _ = broker.queue.pop(0)
        await broker.run_one(name, args)
    name, args, _ = broker.queue.pop(0)
    child_id = args[0]
    stale = asyncio.create_task(broker.run_one(name, args))  # the child's worker freezes mid-turn
    await gate.reached.wait()
    [eng_message] = await ctx.mailbox.inbox("e2e_company::eng", "all")
    # handed over to the child run: the claim no longer expires on the lease's scale
    assert eng_message.status.value == "processing"
    assert eng_message.lease_until > time.time() * 1000 + 365 * 24 * 3600 * 1000

    assert (await expire_and_sweep(ctx)).recovered == [child_id]
    frozen_leases["frozen"] = False
    await broker.drain()
    assert (await ctx.runs.get(child_id)).status.value == "completed"
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    assert record.result.result == "final: done:final: done:worked[build api]"
    [eng_message] = await ctx.mailbox.inbox("e2e_company::eng", "all")
    assert eng_message.status.value == "done"  # the parent message is completed
    assert {m.status.value for m in await all_messages(ctx, "e2e_company")} == {"done"}
    assert executions(raw, prefix, "build api") == 1
    gate.release.set()
    assert await stale == "lost"
    assert [len(await ctx.mailbox.inbox("e2e_eng::backend", "all"))] == [1]


async def test_a_child_run_failing_past_max_attempts_reports_the_failure_upstream(
    env, raw, prefix, monkeypatch, frozen_leases
):
    ctx, broker = env  # max_attempts=2
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.3)
    gate = Gate(times=2)
    hold_send(monkeypatch, gate, "never built", "e2e_eng::backend")
    run_id = await submit(
        ctx, broker, "e2e_company", plan(("eng", "handoff", plan(("backend", "handoff", "never built"))))
    )
    while not any(q.endswith(".e2e_eng.lead") for _, _, q in broker.queue):
        name, args, _ = broker.queue.pop(0)
        await broker.run_one(name, args)
    name, args, _ = broker.queue.pop(0)
    child_id = args[0]
    tasks = [asyncio.create_task(broker.run_one(name, args))]
    await gate.reached.wait()
    assert (await expire_and_sweep(ctx)).recovered == [child_id]
    broker.queue.clear()
    gate.reached.clear()
    tasks.append(asyncio.create_task(lead_segment.resume_lead(ctx, child_id)))
    await gate.reached.wait()
    assert (await expire_and_sweep(ctx)).failed_runs == [child_id]
    assert (await ctx.runs.get(child_id)).status.value == "failed"
    # the parent's message failed with the child's error, the parent run resumed with the report
    [eng_message] = await ctx.mailbox.inbox("e2e_company::eng", "all")
    assert eng_message.status.value == "failed"
    assert RESUME_LEAD_TASK in [n for n, _, _ in broker.queue]
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    assert record.result.result.startswith("final: failed:")
    assert "max_attempts is 2" in record.result.result
    gate.release.set()
    assert [await t for t in tasks] == ["lost", "lost"]
    assert executions(raw, prefix, "never built") == 0


# -- cancel closes what the lead will never read (issue 6) ----------------------------------------


async def test_cancel_with_no_worker_online_closes_the_replies_waiting_for_the_lead(env, raw, prefix):
    from lattice_client import AsyncLatticeClient

    ctx, broker = env
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "r1"), ("other", "handoff", "r2")))
    name, args, _ = broker.queue.pop(0)
    assert await broker.run_one(name, args) == "suspended"
    assert await member_step.deliver(ctx, "e2e::worker") == "done"  # its reply waits for the lead
    [reply] = await ctx.mailbox.inbox("e2e::lead", "pending")
    broker.queue.clear()  # every worker is gone from here on

    client = AsyncLatticeClient(broker_url=REDIS_URL, key_prefix=prefix)
    try:
        report = await client.cancel(run_id)
        [r2] = await ctx.mailbox.inbox("e2e::other", "all")
        assert report.status.value == "cancelled"
        assert sorted(report.cancelled_messages) == sorted([r2.id, reply.id])
        status = await client.status("e2e")
        assert status.mailboxes["e2e::lead"].get("pending", 0) == 0
        assert status.mailboxes["e2e::lead"]["cancelled"] == 1
        assert (await ctx.mailbox.get(reply.id)).status.value == "cancelled"
        assert (await client.cancel(run_id)).cancelled_messages == []  # idempotent
    finally:
        await client.aclose()
    # a worker coming back finds nothing to run
    assert await member_step.deliver(ctx, "e2e::other") == "idle"
    assert executions(raw, prefix, "r2") == 0


async def test_a_reply_sent_after_the_run_was_cancelled_is_closed_by_the_worker(env, raw, prefix):
    ctx, broker = env
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "late sleep=0.4")))
    name, args, _ = broker.queue.pop(0)
    await broker.run_one(name, args)
    member = asyncio.create_task(member_step.deliver(ctx, "e2e::worker"))
    for _ in range(100):  # the member is working
        if raw.lrange(f"{prefix}:test:log", 0, -1):
            break
        await asyncio.sleep(0.02)
    # the run is cancelled before its message is (a cancel racing the member's reply)
    await ctx.runs.cancel(run_id)
    assert await member == "done"  # the member replied upstream...
    [reply] = await ctx.mailbox.inbox("e2e::lead", "all")
    assert reply.metadata.get("kind") != "failure"
    assert reply.status.value == "cancelled"  # ...and the worker closed the reply nobody will read
    assert (await ctx.mailbox.counts("e2e::lead")).get("pending", 0) == 0


async def test_cancel_during_a_lead_turn_cancels_its_sent_tasks_and_stops_the_turn(
    env, raw, prefix, monkeypatch
):
    from lattice_client import AsyncLatticeClient

    ctx, broker = env
    gate = Gate()
    hold_send(monkeypatch, gate, "c2")
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", "c1"), ("other", "handoff", "c2")))
    name, args, _ = broker.queue.pop(0)
    lead = asyncio.create_task(broker.run_one(name, args))
    await gate.reached.wait()  # c1 sent (not registered yet), c2 not
    [c1] = await ctx.mailbox.inbox("e2e::worker", "pending")
    client = AsyncLatticeClient(broker_url=REDIS_URL, key_prefix=prefix)
    try:
        report = await client.cancel(run_id)
    finally:
        await client.aclose()
    assert report.cancelled_messages == [c1.id]
    gate.release.set()
    assert await lead == "cancelled"  # its next write was refused: it stopped
    assert await ctx.mailbox.inbox("e2e::other", "all") == []  # c2 was never sent
    assert (await ctx.mailbox.get(c1.id)).status.value == "cancelled"
    assert await member_step.deliver(ctx, "e2e::worker") == "idle"
    assert executions(raw, prefix, "c1") == 0


@pytest.mark.parametrize("death", ["before_the_child_run_exists", "before_the_claim_was_handed_over"])
async def test_a_worker_dying_while_starting_a_child_run_loses_nothing(env, raw, prefix, monkeypatch, death):
    ctx, broker = env
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.3)
    run_id = await submit(
        ctx, broker, "e2e_company", plan(("eng", "handoff", plan(("backend", "handoff", "x1"))))
    )
    name, args, _ = broker.queue.pop(0)
    assert await broker.run_one(name, args) == "suspended"
    broker.queue.clear()  # the doorbell went to the worker that dies
    dead = None
    if death == "before_the_child_run_exists":  # claimed by the real step, which dies right after
        gate = Gate()
        original_create = ctx.runs.create

        async def create(*a, **kw):
            await gate.wait()
            return await original_create(*a, **kw)

        monkeypatch.setattr(ctx.runs, "create", create)
        dead = asyncio.create_task(member_step.deliver(ctx, "e2e_company::eng"))
        await gate.reached.wait()
    else:  # the child run was created and enqueued, the claim not extended yet
        original = ctx.mailbox.extend_lease
        calls = []

        async def dies(*a, **kw):
            calls.append(a)
            if len(calls) == 1:
                return 0  # never reached the store
            return await original(*a, **kw)

        monkeypatch.setattr(ctx.mailbox, "extend_lease", dies)
        assert await member_step.deliver(ctx, "e2e_company::eng") == "child"
        [(task, _, _)] = broker.queue
        assert task == RUN_LEAD_TASK
    report = await expire_and_sweep(ctx)
    assert len(report.requeued) == 1  # the claim expired: the message is pending again, doorbell rung
    if dead is not None:
        dead.cancel()  # kill -9
        with pytest.raises(asyncio.CancelledError):
            await dead
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed", record
    assert record.result.result == "final: done:final: done:worked[x1]"
    [eng_message] = await ctx.mailbox.inbox("e2e_company::eng", "all")
    assert (eng_message.status.value, eng_message.attempts) == ("done", 2)
    assert len(await ctx.runs.list_runs("e2e_eng")) == 1  # one child run
    assert executions(raw, prefix, "x1") == 1
