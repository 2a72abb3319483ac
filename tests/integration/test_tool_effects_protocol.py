"""Crash-safe tool calls in the distributed runtime, in-process against the real
Redis (docs/tool-effects.md): the task bodies run in the test's loop; a
"crash" is a worker stalled in a tool (its task abandoned) whose claim or lead
lease the test then expires, so another attempt takes the work over -- as the
reaper does after a kill. The stalled attempt is cancelled at the end: its
writes must be refused (fenced). Real-process kills are in tests/e2e.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
import redis

from lattice_client import AsyncLatticeClient, DecisionError
from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK
from lattice_client.runstore import RunStore
from lattice_mailbox.redis import RedisMailbox
from lattice_worker.runtime.lead import segment as lead_segment
from lattice_worker.runtime.member import step as member_step
from lattice_worker.runtime.run.context import WorkerContext
from lattice_worker.runtime.worker.registry import TeamRegistry
from tests.e2e import effect_teams
from tests.e2e.effect_teams import lead_plan, member_plan
from tests.support.races import stale_get
from tests.support.services import REDIS_URL, settings_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]


FAR_FUTURE = 10**13


@pytest.fixture
def tool_prefix(prefix, monkeypatch):
    """The test's key prefix, also where the test tools record (they read LATTICE_KEY_PREFIX)."""
    monkeypatch.setenv("LATTICE_KEY_PREFIX", prefix)
    return prefix


class Env:
    def __init__(self, ctx: WorkerContext, client: AsyncLatticeClient) -> None:
        self.ctx = ctx
        self.client = client
        self.queue: list[tuple[str, list[Any]]] = []
        self.stalled: list[asyncio.Task[Any]] = []

    def send(self, name: str, args: list[Any], queue: str) -> None:
        self.queue.append((name, args))

    async def run(self, name: str, arg: str, *more: str) -> str:
        body = {RUN_LEAD_TASK: lead_segment.run_lead, DELIVER_TASK: member_step.deliver}.get(
            name, lead_segment.resume_lead
        )
        return await body(self.ctx, arg, *more)

    async def drain(self) -> list[str]:
        outs = []
        for _ in range(100):
            if not self.queue:
                return outs
            name, args = self.queue.pop(0)
            outs.append(await self.run(name, *args))
        raise AssertionError("tasks kept coming")

    async def stall(self, name: str, arg: str, raw: redis.Redis, started: str) -> None:
        """Run a task until the log shows ``started``, then leave it stalled there."""
        task = asyncio.ensure_future(self.run(name, arg))
        self.stalled.append(task)
        deadline = time.monotonic() + 20
        while started not in raw.lrange(f"{self.ctx.prefix}:test:log", 0, -1):
            assert not task.done(), task.result()
            assert time.monotonic() < deadline, f"{started} never showed"
            await asyncio.sleep(0.02)

    async def crash_member(self) -> None:
        """The stalled member's claim expires (the reaper requeues it)."""
        moved = await self.ctx.mailbox.requeue_expired(now_ms=FAR_FUTURE, max_attempts=5)
        assert [m.status.value for m in moved] == ["pending"]

    async def crash_lead(self, run_id: str) -> None:
        """The stalled lead's lease expires (the reaper re-enqueues the run)."""
        recovery = await self.ctx.runs.recover_lead(run_id, max_attempts=5, now=FAR_FUTURE)
        assert recovery.action == "requeued"


@pytest.fixture
async def env(tool_prefix):
    prefix = tool_prefix
    settings = settings_for(prefix, lease_seconds=30, max_attempts=5)
    mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
    registry = TeamRegistry(mailbox)
    registry.load("tests.e2e.effect_teams:team")
    registry.load("tests.e2e.effect_teams:gated_team")
    runs = RunStore(REDIS_URL, prefix)
    holder: list[Env] = []
    ctx = WorkerContext(
        settings=settings,
        registry=registry,
        mailbox=mailbox,
        runs=runs,
        send_task=lambda *a: holder[0].send(*a),
    )
    client = AsyncLatticeClient(broker_url=REDIS_URL, key_prefix=prefix)
    sent: list[tuple[str, list[Any]]] = []

    class FakeCelery:  # the client's task sends land in the test's queue
        def send_task(self, name: str, args: list[Any], queue: str) -> None:
            sent.append((name, args))
            holder[0].queue.append((name, args))

        def close(self) -> None:
            pass

    client._celery = FakeCelery()  # noqa: SLF001 - the test stands in for the broker
    e = Env(ctx, client)
    holder.append(e)
    yield e
    for task in e.stalled:
        task.cancel()
    await asyncio.gather(*e.stalled, return_exceptions=True)
    await ctx.writer.flush()
    await client.aclose()
    await runs.aclose()
    await mailbox.aclose()


def effect_cases(p: str) -> list[tuple[str, str, int, str]]:
    """(tool, label, executions, the run's answer) of an interrupted call per
    recoverable effect, the labels starting with ``p``."""
    return [
        ("lookup_docs", f"{p}r-hang", 2, f"found[{p}r-hang]"),  # read_only: runs again
        ("charge", f"{p}c-hang", 2, f"charged[{p}c-hang]"),  # idempotent: sent again with the same key
        ("charge_checked", f"{p}k-hang", 1, f"looked-up[ch_{p}k-hang]"),  # reconcilable, found: its value
        ("charge_checked", f"{p}k2-hang-late", 2, f"charged[{p}k2-hang-late]"),  # final not_found: again
    ]


def count(raw: redis.Redis, prefix: str, name: str, label: str) -> int:
    return int(raw.get(f"{prefix}:test:exec:{name}:{label}") or 0)


def session_key(e: Env) -> str:
    """Where session member ``s``'s conversation is stored (all its work items)."""
    return e.ctx.keys.session("fx::s")


def session_of(e: Env, raw: redis.Redis) -> list[dict[str, Any]]:
    """Session member ``s``'s conversation as stored."""
    return [json.loads(x) for x in raw.lrange(session_key(e), 0, -1)]


def tool_use_ids(conversation: list[dict[str, Any]]) -> list[str]:
    return [
        b["id"]
        for m in conversation
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_use"
    ]


async def submit(e: Env, team: str, prompt: str) -> str:
    run_id = f"run_{uuid.uuid4().hex[:10]}"
    await e.ctx.runs.create(run_id, team, prompt)
    e.queue.append((RUN_LEAD_TASK, [run_id]))
    return run_id


async def start_member(e: Env, task: str, via: str = "m") -> str:
    """Submit a run whose lead asks member ``via`` to do ``task``; returns the
    run id once the lead suspended and the member's doorbell is queued."""
    run_id = await submit(e, "fx", member_plan(task, via=via))
    name, args = e.queue.pop(0)
    assert await e.run(name, args[0]) == "suspended"
    [message] = await e.ctx.mailbox.inbox(f"fx::{via}")
    assert e.queue == [(DELIVER_TASK, [f"fx::{via}", message.id])]  # the doorbell of that message
    e.queue.clear()
    return run_id


async def result_of(e: Env, run_id: str) -> Any:
    record = await e.ctx.runs.get(run_id)
    assert record is not None and record.result is not None, record
    return record.result


# --------------------------------------------------------------------------- members


@pytest.mark.parametrize(
    ("via", "tool_name", "label", "runs", "output"),
    [("m", *case) for case in effect_cases("m")] + [("s", *case) for case in effect_cases("s")],
)
async def test_an_interrupted_member_call_is_recovered_by_its_effect(
    env, raw, prefix, via, tool_name, label, runs, output
):
    # via "m": a template member (its history per work item); "s": a session member (a live
    # Agent, one conversation across its work items)
    e = env
    box = f"fx::{via}"
    run_id = await start_member(e, f"{tool_name} {label}", via=via)
    await e.stall(DELIVER_TASK, box, raw, f"start:{tool_name}:{label}")
    # while the handler runs, what is stored agrees: the turn holding the call, and the call started
    [claimed] = await e.ctx.mailbox.inbox(box, "processing")
    history_key = e.ctx.runs.item_history_key(run_id, claimed.work_item_id)
    history = [json.loads(x) for x in raw.lrange(history_key if via == "m" else session_key(e), 0, -1)]
    journal = raw.hgetall(e.ctx.runs.item_journal_key(run_id, claimed.work_item_id))
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[-1]["content"][0]["id"] == "toolu_target"
    assert json.loads(journal["toolu_prep"])["status"] == "completed"
    assert json.loads(journal["toolu_target"])["status"] == "started"
    await e.crash_member()
    assert await e.run(DELIVER_TASK, box) == "done"  # the re-claimed member resumed
    await e.drain()
    result = await result_of(e, run_id)
    assert (result.status, result.result) == ("completed", f"final: {output}")
    assert count(raw, prefix, tool_name, label) == runs
    assert count(raw, prefix, "prep", label) == 1  # completed before the crash: never again
    if tool_name.startswith("charge"):
        assert raw.get(f"{prefix}:test:provider:count:{label}") == "1"  # the provider saw one effect
    [message] = await e.ctx.mailbox.inbox(box, "all")
    assert (message.status.value, message.attempts) == ("done", 2)
    if tool_name == "charge":  # both sends carried the same effect key
        keys = raw.lrange(f"{prefix}:test:provider:keys:{label}", 0, -1)
        assert keys == [f"{message.work_item_id}:toolu_target"] * 2
    if via == "s":  # one prompt, one turn per call: the item went on in the conversation, not over
        conversation = session_of(e, raw)
        assert sum(isinstance(m["content"], str) for m in conversation) == 1
        assert tool_use_ids(conversation) == ["toolu_prep", "toolu_target", "toolu_reply"]


async def test_an_interrupted_unguarded_member_call_parks_until_resolved(env, raw, prefix):
    e = env
    run_id = await start_member(e, "send_email e1-hang")
    await e.stall(DELIVER_TASK, "fx::m", raw, "start:send_email:e1-hang")
    await e.crash_member()
    assert await e.run(DELIVER_TASK, "fx::m") == "parked"
    [message] = await e.ctx.mailbox.inbox("fx::m", "all")
    assert message.status.value == "parked"
    # parked: never claimed, never requeued; the run stays suspended; no worker waits
    assert await e.ctx.mailbox.claim_next("fx::m") is None
    assert await e.ctx.mailbox.requeue_expired(now_ms=FAR_FUTURE) == []
    assert (await e.ctx.runs.get(run_id)).status.value == "suspended"
    [parked] = await e.client.parked()
    assert parked.message_id == message.id
    assert (parked.run_id, parked.team, parked.member, parked.tool_name, parked.effect) == (
        run_id,
        "fx",
        "m",
        "send_email",
        "unguarded",
    )
    assert parked.input == {"label": "e1-hang"} and parked.reason.startswith("unguarded")
    assert await e.client.parked("other-team") == []
    status = await e.client.status("fx")
    assert [p.message_id for p in status.parked] == [message.id]
    assert status.mailboxes["fx::m"]["parked"] == 1
    events = [ev for _, ev in await e.ctx.runs.events(run_id, count=1000)]
    assert any(ev["type"] == "tool_parked" and ev["id"] == message.id for ev in events)

    # bad decisions change nothing
    for bad, match in (
        ({}, "exactly one"),
        ({"result": "x", "retry": True}, "exactly one"),
        ({"fail": " "}, "non-empty reason"),
    ):
        with pytest.raises(DecisionError, match=match):
            await e.client.resolve(message.id, **bad)
    with pytest.raises(DecisionError, match="unknown id"):
        await e.client.resolve("no-such-id", retry=True)
    with pytest.raises(DecisionError, match="unknown id"):
        await e.client.resolve(f"{run_id}-nope/toolu_target", retry=True)
    with pytest.raises(DecisionError, match="is a parked call: use resolve"):
        await e.client.approve(message.id)
    assert e.queue == [] and (await e.ctx.mailbox.get(message.id)).status.value == "parked"

    decided = await e.client.resolve(message.id, result="sent by hand")
    assert decided.message_id == message.id
    assert (await e.ctx.mailbox.get(message.id)).status.value == "pending"
    with pytest.raises(DecisionError, match="not waiting"):  # resolving twice
        await e.client.resolve(message.id, result="again")
    assert e.queue == [(DELIVER_TASK, ["fx::m"])]
    await e.drain()
    result = await result_of(e, run_id)
    assert (result.status, result.result) == ("completed", "final: sent by hand")
    assert count(raw, prefix, "send_email", "e1-hang") == 1 and count(raw, prefix, "prep", "e1-hang") == 1
    assert await e.client.parked() == []
    with pytest.raises(DecisionError, match="not a parked call|not waiting"):
        await e.client.resolve(message.id, retry=True)


@pytest.mark.parametrize(
    ("decision", "output", "runs"),
    [("retry", "final: sent[e2-hang]", 2), ("fail", "final: error:Error: bounced", 1)],
)
async def test_retry_runs_a_parked_call_again_and_fail_gives_the_model_the_reason(
    env, raw, prefix, decision, output, runs
):
    e = env
    run_id = await start_member(e, "send_email e2-hang")
    await e.stall(DELIVER_TASK, "fx::m", raw, "start:send_email:e2-hang")
    await e.crash_member()
    assert await e.run(DELIVER_TASK, "fx::m") == "parked"
    [parked] = await e.client.parked("fx")
    if decision == "retry":
        await e.client.resolve(parked.message_id, retry=True)
    else:
        await e.client.resolve(parked.message_id, fail="bounced")
    await e.drain()
    result = await result_of(e, run_id)
    assert (result.status, result.result) == ("completed", output)
    assert count(raw, prefix, "send_email", "e2-hang") == runs


@pytest.mark.parametrize("via", ["m", "s"])
async def test_a_reclaimed_attempt_parked_at_the_budget_keeps_the_interrupted_turn(
    env, raw, prefix, monkeypatch, via
):
    # a model asked a turn again gives its calls new ids (here: a counter), unknown to the
    # journal: the interrupted turn must stay stored until it is replayed
    e = env
    ids = iter(range(1000))
    make = effect_teams._tool_use
    monkeypatch.setattr(effect_teams, "_tool_use", lambda n, i, tid: make(n, i, f"{tid}_{next(ids)}"))
    box = f"fx::{via}"
    run_id = f"run_{uuid.uuid4().hex[:10]}"
    await e.ctx.runs.create(run_id, "fx", member_plan("send_email eb-hang", via=via), budget_tokens=10**6)
    assert await e.run(RUN_LEAD_TASK, run_id) == "suspended"
    e.queue.clear()
    await e.stall(DELIVER_TASK, box, raw, "start:send_email:eb-hang")
    await e.crash_member()
    raw.hset(e.ctx.runs.keys(run_id).record, "spent_tokens", 10**6)  # other calls spent the budget meanwhile
    assert await e.run(DELIVER_TASK, box) == "budget_reached"  # before the replayed turn's "call"
    await e.client.raise_budget(run_id, tokens=2 * 10**6)
    await e.drain()
    [parked] = await e.client.parked("fx")  # the replayed call is decided by its effect: it parks
    assert (parked.member, parked.tool_name, parked.effect) == (via, "send_email", "unguarded")
    assert count(raw, prefix, "send_email", "eb-hang") == 1 and count(raw, prefix, "prep", "eb-hang") == 1


async def test_the_stalled_attempt_writes_nothing_after_its_claim_was_taken(env, raw, prefix):
    e = env
    run_id = await start_member(e, "lookup_docs r9-hang")
    await e.stall(DELIVER_TASK, "fx::m", raw, "start:lookup_docs:r9-hang")
    stalled = e.stalled.pop()
    await e.crash_member()
    assert await e.run(DELIVER_TASK, "fx::m") == "done"
    await e.drain()
    history_key = e.ctx.runs.item_history_key(
        run_id, (await e.ctx.mailbox.inbox("fx::m", "all"))[0].work_item_id
    )
    before = raw.lrange(history_key, 0, -1)
    stalled.cancel()  # the old attempt wakes up and tries to record its batch
    await asyncio.gather(stalled, return_exceptions=True)
    await e.ctx.writer.flush()
    assert raw.lrange(history_key, 0, -1) == before
    assert (await result_of(e, run_id)).result == "final: found[r9-hang]"


# --------------------------------------------------------------------------- session members


async def park_session_email(e: Env, raw: redis.Redis, label: str) -> str:
    """A run whose session member ``s`` parks its interrupted ``send_email <label>``; its id."""
    run_id = await start_member(e, f"send_email {label}", via="s")
    await e.stall(DELIVER_TASK, "fx::s", raw, f"start:send_email:{label}")
    await e.crash_member()
    assert await e.run(DELIVER_TASK, "fx::s") == "parked"
    return run_id


async def test_an_interrupted_unguarded_session_member_call_parks_and_the_session_goes_on(env, raw, prefix):
    e = env
    run_id = await park_session_email(e, raw, "se-hang")
    [parked] = await e.client.parked("fx")
    assert (parked.member, parked.tool_name, parked.effect) == ("s", "send_email", "unguarded")
    assert count(raw, prefix, "send_email", "se-hang") == 1 and count(raw, prefix, "prep", "se-hang") == 1
    await e.client.resolve(parked.message_id, result="sent by hand")
    await e.drain()
    result = await result_of(e, run_id)
    assert (result.status, result.result) == ("completed", "final: sent by hand")
    assert count(raw, prefix, "send_email", "se-hang") == 1 and count(raw, prefix, "prep", "se-hang") == 1
    # the session's next item continues the same conversation
    second = await start_member(e, "lookup_docs s2", via="s")
    assert await e.run(DELIVER_TASK, "fx::s") == "done"
    await e.drain()
    assert (await result_of(e, second)).result == "final: found[s2]"
    conversation = session_of(e, raw)
    assert sum(isinstance(m["content"], str) for m in conversation) == 2
    assert tool_use_ids(conversation) == ["toolu_prep", "toolu_target", "toolu_reply"] * 2


# --------------------------------------------------------------------------- the lead's own tools


@pytest.mark.parametrize(
    ("tool_name", "label", "runs", "output"),
    effect_cases("l"),
)
async def test_an_interrupted_lead_call_is_recovered_by_its_effect(
    env, raw, prefix, tool_name, label, runs, output
):
    e = env
    run_id = await submit(e, "fx", lead_plan(f"{tool_name} {label}"))
    e.queue.clear()
    await e.stall(RUN_LEAD_TASK, run_id, raw, f"start:{tool_name}:{label}")
    await e.crash_lead(run_id)
    assert await e.run(RESUME_LEAD_TASK, run_id) == "completed"
    result = await result_of(e, run_id)
    assert result.result == f"final: {output}"
    assert count(raw, prefix, tool_name, label) == runs
    assert count(raw, prefix, "prep", label) == 1
    if tool_name.startswith("charge"):
        assert raw.get(f"{prefix}:test:provider:count:{label}") == "1"


async def test_an_interrupted_unguarded_lead_call_parks_the_run_until_resolved(env, raw, prefix):
    e = env
    run_id = await submit(e, "fx", lead_plan("send_email le-hang"))
    e.queue.clear()
    await e.stall(RUN_LEAD_TASK, run_id, raw, "start:send_email:le-hang")
    await e.crash_lead(run_id)
    assert await e.run(RESUME_LEAD_TASK, run_id) == "parked"
    record = await e.ctx.runs.get(run_id)
    assert record.status.value == "suspended"
    [parked] = await e.client.parked("fx")
    assert parked.message_id == f"{run_id}/toolu_target" and parked.member == "lead"
    assert await e.run(RESUME_LEAD_TASK, run_id) == "skipped"  # nothing resumes it but a decision
    with pytest.raises(DecisionError, match="is not a parked call"):
        await e.client.resolve(f"{run_id}/toolu_nope", result="x")
    await e.client.resolve(parked.message_id, result="mailed by hand")
    with pytest.raises(DecisionError):
        await e.client.resolve(parked.message_id, result="mailed by hand")
    assert e.queue == [(RESUME_LEAD_TASK, [run_id])]
    assert await e.drain() == ["completed"]
    result = await result_of(e, run_id)
    assert result.result == "final: mailed by hand"
    assert count(raw, prefix, "send_email", "le-hang") == 1 and count(raw, prefix, "prep", "le-hang") == 1
    events = [
        ev["status"] for _, ev in await e.ctx.runs.events(run_id, count=1000) if ev["type"] == "run_status"
    ]
    assert "parked" in events


# --------------------------------------------------------------------------- approvals


async def test_a_member_call_waits_for_an_approval_holding_no_worker(env, raw, prefix):
    e = env
    run_id = await start_member(e, "send_email a1", via="gate")
    assert await e.run(DELIVER_TASK, "fx::gate") == "awaiting_approval"
    assert count(raw, prefix, "prep", "a1") == 0  # prep is unguarded too: it waits first
    [message] = await e.ctx.mailbox.inbox("fx::gate", "all")
    assert message.status.value == "parked"
    [pending] = await e.client.approvals("fx")
    assert pending.call_id == f"{message.id}/toolu_prep" and pending.tool_name == "prep"
    assert await e.client.parked() == []
    with pytest.raises(DecisionError, match="approve / deny"):
        await e.client.resolve(pending.call_id, retry=True)
    with pytest.raises(DecisionError, match="non-empty reason"):
        await e.client.deny(pending.call_id, "")
    await e.client.approve(pending.call_id)
    with pytest.raises(DecisionError):
        await e.client.approve(pending.call_id)  # twice
    assert await e.drain() == ["awaiting_approval"]  # prep ran; now send_email waits
    assert count(raw, prefix, "prep", "a1") == 1
    [pending] = await e.client.approvals()
    assert pending.tool_name == "send_email"
    await e.client.deny(pending.call_id, "not to this customer")
    await e.drain()
    result = await result_of(e, run_id)
    assert result.result == "final: error:not to this customer"
    assert count(raw, prefix, "send_email", "a1") == 0 and count(raw, prefix, "prep", "a1") == 1


async def test_a_decision_never_releases_a_claim_taken_after_it_read_the_message(env, monkeypatch):
    # the decision read the member's message "parked"; before it moved it back to
    # "pending", the message was moved and claimed by a worker. processing ->
    # pending is allowed, so the move used to release that claim and ring a
    # second doorbell; now it moves only from "parked" and sends nothing.
    e = env
    await start_member(e, "send_email a3", via="gate")
    assert await e.run(DELIVER_TASK, "fx::gate") == "awaiting_approval"
    [pending] = await e.client.approvals("fx")
    [message] = await e.ctx.mailbox.inbox("fx::gate", "parked")
    mailbox = e.client.mailbox
    real_get = mailbox.get

    async def meanwhile() -> Any:  # moved on by someone else and claimed by a worker
        await mailbox.update_status(message.id, "pending")
        return await mailbox.claim_next("fx::gate", lease_s=30, worker_id="w-other", message_id=message.id)

    get, claims = stale_get(mailbox, message.id, meanwhile)  # the decision reads it "parked"
    monkeypatch.setattr(mailbox, "get", get)
    await e.client.approve(pending.call_id)
    held = await real_get(message.id)
    assert claims[0] is not None and claims[0].id == message.id
    assert (held.status.value, held.claimed_by) == ("processing", "w-other"), held  # the claim holds
    assert e.queue == []  # no second doorbell


async def test_a_member_call_is_listed_for_a_decision_only_once_its_message_is_parked(env, monkeypatch):
    """The member stores its wait, then parks its message: in between, a listed
    call could not be decided yet ("has not stopped on it"), so it is not listed."""
    e = env
    await start_member(e, "send_email a2", via="gate")
    complete = e.ctx.mailbox.complete
    stored, release = asyncio.Event(), asyncio.Event()

    async def held_complete(message_id: str, token: str, status: Any) -> Any:
        stored.set()
        await release.wait()
        return await complete(message_id, token, status)

    monkeypatch.setattr(e.ctx.mailbox, "complete", held_complete)
    step = asyncio.ensure_future(e.run(DELIVER_TASK, "fx::gate"))
    await asyncio.wait_for(stored.wait(), 20)
    [message] = await e.ctx.mailbox.inbox("fx::gate", "all")
    assert message.status.value == "processing"
    assert await e.ctx.runs.waits(kind="approval")  # the wait is stored ...
    assert await e.client.approvals() == [] and await e.client.approvals("fx") == []  # ... not offered yet
    release.set()
    assert await asyncio.wait_for(step, 20) == "awaiting_approval"
    [pending] = await e.client.approvals("fx")
    assert pending.call_id == f"{message.id}/toolu_prep"
    await e.client.approve(pending.call_id)  # decidable as soon as it is listed


async def test_a_lead_call_waits_for_an_approval_with_the_run_suspended(env, raw, prefix):
    e = env
    run_id = await submit(e, "fx_gated", lead_plan("lookup_docs la"))
    assert await e.drain() == ["awaiting_approval"]  # prep needs an approval; lookup_docs would not
    assert (await e.ctx.runs.get(run_id)).status.value == "suspended"
    [pending] = await e.client.approvals("fx_gated")
    assert pending.call_id == f"{run_id}/toolu_prep" and pending.message_id is None
    await e.client.approve(pending.call_id)
    assert await e.drain() == ["completed"]
    assert (await result_of(e, run_id)).result == "final: found[la]"
    assert count(raw, prefix, "prep", "la") == 1 and count(raw, prefix, "lookup_docs", "la") == 1
