"""The reaper repairs work items whose member closed its message and then died.

A member step closes its task message (``done`` / ``failed``), sends its reply
upstream and only then records the outcome in the run. A worker killed in
between leaves a terminal message and a suspended run waiting for ever; the
reaper (``reaper_orphans.repair_orphans``) completes such items once their message
has been seen terminal for over a lease. Real Redis, one key prefix per test
(deleted afterwards); task bodies run in the test's loop, as in
``test_distributed_protocol``. A "kill -9" is a ``BaseException`` raised at the
chosen point: nothing after it runs.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK
from lattice_client.runstore import RunStore
from lattice_mailbox.redis import RedisMailbox
from lattice_worker.runtime.member import step as member_step
from lattice_worker.runtime.reaper import orphans as reaper_orphans
from lattice_worker.runtime.reaper import sweep as reaper
from lattice_worker.runtime.run.context import WorkerContext
from lattice_worker.runtime.worker.registry import TeamRegistry
from lattice_worker.team.mailbox_state import MailboxToolState
from lattice_worker.team.reports import parse_report_message
from tests.e2e.teams import plan
from tests.integration.test_distributed_protocol import Broker, executions, submit
from tests.support.services import REDIS_URL, settings_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

LEASE_S = 0.2


class Killed(BaseException):
    """The worker process dies here (kill -9): nothing after this point runs."""


@pytest.fixture
def prefix(prefix, monkeypatch):
    """The shared unique prefix (conftest), also as ``LATTICE_KEY_PREFIX``."""
    monkeypatch.setenv("LATTICE_KEY_PREFIX", prefix)
    return prefix


@pytest.fixture
async def env(prefix):
    settings = settings_for(prefix, lease_seconds=LEASE_S, max_attempts=2, reaper_interval_seconds=0.2)
    mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
    registry = TeamRegistry(mailbox)
    registry.load("tests.e2e.teams:team")
    runs = RunStore(REDIS_URL, prefix)
    broker = Broker(None)
    ctx = WorkerContext(
        settings=settings, registry=registry, mailbox=mailbox, runs=runs, send_task=broker.send
    )
    broker.ctx = ctx
    yield ctx, broker
    await runs.aclose()
    await mailbox.aclose()


async def suspended_run(ctx: WorkerContext, broker: Broker, task: str) -> str:
    """A run whose lead handed ``task`` to ``worker`` and suspended; its doorbell is dropped
    (the test runs the member step itself)."""
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", task)))
    name, args, _ = broker.queue.pop(0)
    assert await broker.run_one(name, args) == "suspended"
    assert [n for n, _, _ in broker.queue] == [DELIVER_TASK]
    broker.queue.clear()
    return run_id


async def dies_in_member_step(ctx: WorkerContext, monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """Run the member step for ``e2e::worker``; its worker is killed at ``target``:
    ``"complete"`` (message closed, upstream message sent, item not recorded) or
    ``"reply"`` (message closed ``done``, the reply not sent)."""

    async def killed(*args, **kwargs):
        raise Killed

    with monkeypatch.context() as patch:
        if target == "complete":
            patch.setattr(member_step, "complete_work_item", killed)
        else:
            patch.setattr(MailboxToolState, "_send_upstream", killed)
        with pytest.raises(Killed):
            await member_step.deliver(ctx, "e2e::worker")


async def sweep_after_a_lease(ctx: WorkerContext) -> reaper.SweepReport:
    await asyncio.sleep(LEASE_S + 0.05)
    report = await reaper.sweep(ctx, force=True)
    assert report is not None
    return report


def lead_reports(raw: redis.Redis, ctx: WorkerContext, run_id: str) -> list[dict]:
    history = [json.loads(x) for x in raw.lrange(ctx.keys.history(run_id), 0, -1)]
    return [e for m in history for e in parse_report_message(m)]


@pytest.mark.parametrize(
    ("task", "message_status", "outcome_status", "kind"),
    [("a", "done", "done", "reply"), ("x fail", "failed", "failed", "diagnostic")],
)
async def test_an_item_whose_worker_died_after_replying_completes_with_the_members_answer(
    env, raw, prefix, monkeypatch, task, message_status, outcome_status, kind
):
    ctx, broker = env
    run_id = await suspended_run(ctx, broker, task)
    await dies_in_member_step(ctx, monkeypatch, "complete")
    [message] = await ctx.mailbox.inbox("e2e::worker", "all")
    [upstream] = await ctx.mailbox.inbox("e2e::lead", "pending")
    assert (message.status.value, upstream.reply_to, upstream.metadata["kind"]) == (
        message_status,
        message.id,
        kind,
    )
    [item] = await ctx.runs.items(run_id)
    assert item["outcome"] is None and (await ctx.runs.get(run_id)).status.value == "suspended"

    first = await sweep_after_a_lease(ctx)  # seen terminal now: a live worker may be about to record it
    assert first.orphans == [] and broker.queue == []
    second = await sweep_after_a_lease(ctx)
    assert second.orphans == [item["work_item_id"]]
    assert [n for n, _, _ in broker.queue] == [RESUME_LEAD_TASK]
    [item] = await ctx.runs.items(run_id)
    assert item["state"] == "done"
    assert (item["outcome"]["status"], item["outcome"]["report"]["id"]) == (outcome_status, upstream.id)
    third = await sweep_after_a_lease(ctx)  # nothing more to repair (the resume, not run yet, is re-sent)
    assert third.orphans == [] and {n for n, _, _ in broker.queue} == {RESUME_LEAD_TASK}
    [same] = await ctx.runs.items(run_id)
    assert same == item

    await broker.drain()
    assert await sweep_after_a_lease(ctx) == reaper.SweepReport()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    if outcome_status == "done":
        assert record.result.result == "final: done:worked[a]"
    else:
        assert record.result.result.startswith("final: failed:") and "no_reply" in record.result.result
    [entry] = lead_reports(raw, ctx, run_id)
    assert (entry["status"], entry["report_message_id"]) == (outcome_status, upstream.id)
    # the member's own upstream message was used (no second one) and the lead consumed it
    assert [(m.id, m.status.value) for m in await ctx.mailbox.inbox("e2e::lead", "all")] == [
        (upstream.id, "done")
    ]
    assert await ctx.mailbox.inbox("e2e::worker", "pending") == []
    assert executions(raw, prefix, task) == 1


async def test_an_item_whose_reply_was_lost_fails_with_a_diagnostic_to_the_lead(
    env, raw, prefix, monkeypatch
):
    ctx, broker = env
    run_id = await suspended_run(ctx, broker, "b")
    await dies_in_member_step(ctx, monkeypatch, "reply")
    [message] = await ctx.mailbox.inbox("e2e::worker", "all")
    assert message.status.value == "done"
    assert await ctx.mailbox.inbox("e2e::lead", "all") == []  # the reply never left

    assert (await sweep_after_a_lease(ctx)).orphans == []
    second = await sweep_after_a_lease(ctx)
    assert second.orphans == [message.work_item_id]
    assert (await sweep_after_a_lease(ctx)).orphans == []
    [diagnostic] = await ctx.mailbox.inbox("e2e::lead", "all")  # one, even after more sweeps
    assert (diagnostic.reply_to, diagnostic.work_item_id) == (message.id, message.work_item_id)
    assert diagnostic.metadata["kind"] == "diagnostic" and diagnostic.metadata["status"] == "failed"
    assert f"died after closing message {message.id}" in diagnostic.content
    assert "its reply was lost" in diagnostic.content

    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    assert record.result.result.startswith("final: failed:") and "reply_lost" in record.result.result
    [entry] = lead_reports(raw, ctx, run_id)
    assert entry["status"] == "failed" and entry["error"]["code"] == "reply_lost"
    assert "worker running member worker died" in entry["error"]["message"]
    assert entry["report_message_id"] == diagnostic.id
    assert (await ctx.mailbox.get(diagnostic.id)).status.value == "done"  # the lead read it
    events = [e for _, e in await ctx.runs.events(run_id, count=1000)]
    assert any(
        e["type"] == "team_message"
        and e["subtype"] == "failed"
        and (e.get("error") or {}).get("code") == "reply_lost"
        for e in events
    )


async def test_a_reaper_dying_after_sending_the_diagnostic_does_not_send_it_twice(
    env, raw, prefix, monkeypatch
):
    ctx, broker = env
    run_id = await suspended_run(ctx, broker, "c")
    await dies_in_member_step(ctx, monkeypatch, "reply")
    assert (await sweep_after_a_lease(ctx)).orphans == []

    async def killed(*args, **kwargs):
        raise Killed

    await asyncio.sleep(LEASE_S + 0.05)
    with monkeypatch.context() as patch:  # the reaper's worker dies before completing the item
        patch.setattr(reaper_orphans, "complete_work_item", killed)
        with pytest.raises(Killed):
            await reaper.sweep(ctx, force=True)
    [diagnostic] = await ctx.mailbox.inbox("e2e::lead", "all")
    assert (await ctx.runs.get(run_id)).status.value == "suspended"

    report = await sweep_after_a_lease(ctx)
    [item] = await ctx.runs.items(run_id)
    assert report.orphans == [item["work_item_id"]]
    assert item["outcome"]["report"]["id"] == diagnostic.id
    assert [m.id for m in await ctx.mailbox.inbox("e2e::lead", "all")] == [diagnostic.id]
    await broker.drain()
    assert "reply_lost" in (await ctx.runs.get(run_id)).result.result


async def test_a_live_item_is_left_alone(env, raw, prefix):
    ctx, broker = env
    run_id = await suspended_run(ctx, broker, "d")
    # a live worker holds the message (its lease is renewed; here: long)
    claimed = await ctx.mailbox.claim_next("e2e::worker", lease_s=30, worker_id="alive")
    for _ in range(3):
        report = await sweep_after_a_lease(ctx)
        assert report.orphans == [] and report.requeued == []
    assert broker.queue == []
    current = await ctx.mailbox.get(claimed.id)
    assert (current.status.value, current.claimed_by) == ("processing", "alive")
    [item] = await ctx.runs.items(run_id)
    assert item["outcome"] is None and item["state"] != "done"
    assert (await ctx.runs.get(run_id)).status.value == "suspended"
    assert await ctx.mailbox.inbox("e2e::lead", "all") == []


async def test_a_member_still_working_after_its_reply_completes_its_item(env, raw, prefix, monkeypatch):
    """The lease keeper's next renewal finds the message closed (by this same
    claim): that is not a lost claim, the member's outcome stands."""
    ctx, broker = env
    run_id = await suspended_run(ctx, broker, "e")
    original = MailboxToolState.reply

    async def reply_then_work(self, *args, **kwargs):
        sent = await original(self, *args, **kwargs)
        await asyncio.sleep(LEASE_S)  # past the keeper's next renewal (every lease / 3)
        return sent

    monkeypatch.setattr(MailboxToolState, "reply", reply_then_work)
    assert await member_step.deliver(ctx, "e2e::worker") == "done"
    [item] = await ctx.runs.items(run_id)
    assert item["state"] == "done" and item["outcome"]["status"] == "done"
    await broker.drain()
    assert (await ctx.runs.get(run_id)).result.result == "final: done:worked[e]"


async def test_an_item_whose_aborted_member_died_completes_cancelled(env, raw, prefix):
    ctx, broker = env
    run_id = await suspended_run(ctx, broker, "f")
    # the member was aborted: its message closed cancelled (nothing goes upstream), then it died
    claimed = await ctx.mailbox.claim_next("e2e::worker", lease_s=30, worker_id="aborted")
    await ctx.mailbox.complete(claimed.id, claimed.claim_token, "cancelled")
    assert (await sweep_after_a_lease(ctx)).orphans == []
    assert (await sweep_after_a_lease(ctx)).orphans == [claimed.work_item_id]
    assert await ctx.mailbox.inbox("e2e::lead", "all") == []
    await broker.drain()
    assert (await ctx.runs.get(run_id)).status.value == "completed"
    [entry] = lead_reports(raw, ctx, run_id)
    assert entry["status"] == "cancelled" and entry["error"]["code"] == "aborted"
    assert f"message {claimed.id} was cancelled" in entry["content"]
    assert executions(raw, prefix, "f") == 0


async def test_an_item_whose_worker_died_after_a_followup_completes_open_with_it(
    env, raw, prefix, monkeypatch
):
    ctx, broker = env
    run_id = await suspended_run(ctx, broker, "g followup")
    await dies_in_member_step(ctx, monkeypatch, "complete")
    [message] = await ctx.mailbox.inbox("e2e::worker", "all")
    [followup] = await ctx.mailbox.inbox("e2e::lead", "pending")
    assert message.status.value == "read"  # left open: the member sent only a follow-up
    assert (followup.reply_to, followup.metadata["kind"]) == (message.id, "followup")
    [item] = await ctx.runs.items(run_id)
    assert item["outcome"] is None

    assert (await sweep_after_a_lease(ctx)).orphans == []  # seen open now
    assert (await sweep_after_a_lease(ctx)).orphans == [item["work_item_id"]]
    assert [n for n, _, _ in broker.queue] == [RESUME_LEAD_TASK]
    [item] = await ctx.runs.items(run_id)
    assert item["state"] == "done"
    outcome = item["outcome"]
    assert (outcome["status"], outcome["report"]["id"]) == ("open", followup.id)
    assert outcome["content"] == "progress: worked[g followup]"
    assert (await sweep_after_a_lease(ctx)).orphans == []

    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    [entry] = lead_reports(raw, ctx, run_id)
    assert (entry["status"], entry["report_message_id"]) == ("open", followup.id)
    assert [m.id for m in await ctx.mailbox.inbox("e2e::lead", "all")] == [followup.id]  # no diagnostic
    assert executions(raw, prefix, "g followup") == 1


async def test_an_item_left_read_by_a_dead_run_is_repaired_once_its_mailbox_is_idle(env, raw, prefix):
    ctx, broker = env
    run_id = await suspended_run(ctx, broker, "h")
    [message] = await ctx.mailbox.inbox("e2e::worker", "pending")
    # another run of the member opened it (team_read) and then its worker died, sending nothing
    assert await ctx.mailbox.update_status(message.id, "read")
    await ctx.mailbox.send("e2e::lead", "e2e::worker", "something else")
    busy = await ctx.mailbox.claim_next("e2e::worker", lease_s=30, worker_id="alive")
    for _ in range(3):  # a live run of the member may still answer it
        assert (await sweep_after_a_lease(ctx)).orphans == []
    assert await ctx.mailbox.inbox("e2e::lead", "all") == []

    await ctx.mailbox.complete(busy.id, busy.claim_token, "done")  # the live run ended
    assert (await sweep_after_a_lease(ctx)).orphans == []
    assert (await sweep_after_a_lease(ctx)).orphans == [message.work_item_id]
    [diagnostic] = await ctx.mailbox.inbox("e2e::lead", "all")
    assert (diagnostic.reply_to, diagnostic.metadata["kind"]) == (message.id, "diagnostic")
    assert f"died with message {message.id} open (read)" in diagnostic.content
    await broker.drain()
    [entry] = lead_reports(raw, ctx, run_id)
    assert entry["status"] == "failed" and entry["error"]["code"] == "reply_lost"
    assert (await ctx.runs.get(run_id)).status.value == "completed"
