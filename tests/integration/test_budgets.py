"""Token budgets (issue 22), in-process against the real Redis: the task bodies
run in the test's loop on several worker contexts; the tasks they send are
run by the test. A run parks as ``budget_reached`` (no lease, no step
running), spends at most one call past its budget, and completes after
``raise_budget``; bad raises change nothing."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import pytest

from lattice_client import AsyncLatticeClient, BudgetError, RunNotFoundError
from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK
from lattice_client.runstore import RunStore
from lattice_mailbox.redis import RedisMailbox
from lattice_worker.runtime.lead import segment as lead_segment
from lattice_worker.runtime.member import step as member_step
from lattice_worker.runtime.run.context import WorkerContext
from lattice_worker.runtime.worker.registry import TeamRegistry
from tests.e2e.budget_teams import CALL_TOKENS, parallel_run_tokens, run_tokens
from tests.support.races import stale_get
from tests.support.registry import publish_fake_worker
from tests.support.services import REDIS_URL, settings_for
from tests.support.ui_page import ui_html

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

TEAM = "e2e_budget"

TASK_BODIES = {
    RUN_LEAD_TASK: lead_segment.run_lead,
    DELIVER_TASK: member_step.deliver,
    RESUME_LEAD_TASK: lead_segment.resume_lead,
}


class Env:
    """``workers`` contexts sharing one prefix; tasks go to ``queue`` and run round-robin."""

    def __init__(self, prefix: str, workers: int) -> None:
        self.queue: list[tuple[str, list[Any]]] = []
        self.ctxs: list[WorkerContext] = []
        self.outcomes: list[str] = []
        self._turn = 0
        for _ in range(workers):
            mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
            registry = TeamRegistry(mailbox)
            registry.load("tests.e2e.budget_teams:team")
            registry.load("tests.e2e.budget_teams:default_team")
            registry.load("tests.e2e.budget_teams:compact_team")
            registry.load("tests.e2e.budget_teams:parallel_team")
            registry.load("tests.e2e.budget_teams:session_team")
            self.ctxs.append(
                WorkerContext(
                    settings=settings_for(prefix, lease_seconds=30),
                    registry=registry,
                    mailbox=mailbox,
                    runs=RunStore(REDIS_URL, prefix),
                    send_task=lambda name, args, queue: self.queue.append((name, list(args))),
                )
            )
        self.client = AsyncLatticeClient(broker_url=REDIS_URL, key_prefix=prefix)
        env = self

        class FakeCelery:  # the client's task sends land in the test's queue
            def send_task(self, name: str, args: list[Any], queue: str) -> None:
                env.queue.append((name, list(args)))

            def close(self) -> None:
                pass

        self.client._celery = FakeCelery()  # noqa: SLF001 - the test stands in for the broker

    async def drain(self) -> list[str]:
        outs: list[str] = []
        for _ in range(200):
            if not self.queue:
                self.outcomes += outs
                return outs
            name, args = self.queue.pop(0)
            ctx = self.ctxs[self._turn % len(self.ctxs)]
            self._turn += 1
            outs.append(await TASK_BODIES[name](ctx, *args))
            await ctx.writer.flush()
        raise AssertionError("tasks kept coming")

    async def drain_parallel(self) -> list[str]:
        """:meth:`drain`, but the tasks queued at each round run at once (one per
        context in turn), so work items sent together are worked on together."""
        outs: list[str] = []
        for _ in range(50):
            if not self.queue:
                self.outcomes += outs
                return outs
            batch, self.queue = self.queue, []
            bodies = []
            for name, args in batch:
                ctx = self.ctxs[self._turn % len(self.ctxs)]
                self._turn += 1
                bodies.append(TASK_BODIES[name](ctx, *args))
            outs += await asyncio.gather(*bodies)
            for ctx in self.ctxs:
                await ctx.writer.flush()
        raise AssertionError("tasks kept coming")

    async def submit(self, asks: int, budget: int | None, team: str = TEAM) -> str:
        run_id = f"run_{uuid.uuid4().hex[:10]}"
        await self.client.runs.create(run_id, team, str(asks), budget_tokens=budget)
        self.queue.append((RUN_LEAD_TASK, [run_id]))
        return run_id

    async def close(self) -> None:
        for ctx in self.ctxs:
            await ctx.writer.aclose()
            await ctx.runs.aclose()
            await ctx.mailbox.aclose()
        await self.client.aclose()


@pytest.fixture
async def make_env(prefix):
    made: list[Env] = []

    def make(workers: int = 1) -> Env:
        env = Env(prefix, workers)
        made.append(env)
        return env

    yield make
    for env in made:
        await env.close()


async def test_a_run_parks_at_its_budget_and_completes_after_raise_budget(make_env, raw, prefix):
    e = make_env(1)
    run_id = await e.submit(3, 2_000)
    outs = await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "budget_reached", (record, outs)
    # parked: no lease, not in the lease index, no task left, no message in flight
    assert "budget_reached" in outs
    assert not raw.hget(record_key(prefix, run_id), "lease_token")
    assert raw.zscore(f"{prefix}:runs:leased", run_id) is None
    assert e.queue == []
    # never more than the one call in flight past the budget
    assert 2_000 <= record.spent_tokens < 2_000 + CALL_TOKENS
    assert record.budget_tokens == 2_000
    spent_at_park = record.spent_tokens

    # the events name the budget and the spend
    events = [ev for _, ev in await e.client.runs.events(run_id, count=1000)]
    parks = [ev for ev in events if ev.get("status") == "budget_reached"]
    assert parks and parks[-1]["budget"] == {"tokens": 2_000}
    assert parks[-1]["spent_tokens"] == spent_at_park

    raised = await e.client.raise_budget(run_id, tokens=10_000)
    assert raised.budget_tokens == 10_000 and raised.previous_tokens == 2_000
    assert raised.spent_tokens == spent_at_park
    assert raised.resumed_lead or raised.resumed_messages
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed", record
    assert record.result.result == "final: answer0 | answer1 | answer2"
    assert record.spent_tokens == run_tokens(3)


async def test_the_lead_parks_and_resumes_from_where_it_stopped(make_env):
    # calls: lead 350, member 700, 1050, lead 1400, member 1750, 2100 -> the lead's next call parks
    e = make_env(1)
    run_id = await e.submit(3, 2_000)
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "budget_reached"
    assert record.spent_tokens == 6 * CALL_TOKENS
    raised = await e.client.raise_budget(run_id, tokens=5_000)
    assert raised.resumed_lead and raised.resumed_messages == []
    assert e.queue == [(RESUME_LEAD_TASK, [run_id])]
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed"
    assert record.spent_tokens == run_tokens(3)


async def test_a_member_parks_with_its_message_and_resumes_on_the_raise(make_env):
    # budget 1_700: the member's second call of item 1 (spend 1_750 before it) parks
    e = make_env(1)
    run_id = await e.submit(3, 1_700)
    outs = await e.drain()
    assert outs[-1] == "budget_reached", outs
    record = await e.client.get_run(run_id)
    assert record.status.value == "budget_reached"
    assert record.spent_tokens == 5 * CALL_TOKENS
    raised = await e.client.raise_budget(run_id, tokens=20_000)
    assert not raised.resumed_lead and len(raised.resumed_messages) == 1
    [(name, args)] = e.queue
    assert name == DELIVER_TASK and args[1] == raised.resumed_messages[0]
    assert (await e.client.get_run(run_id)).status.value == "suspended"
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed", record
    assert record.result.result == "final: answer0 | answer1 | answer2"
    assert record.spent_tokens == run_tokens(3)


async def test_a_session_member_parks_at_the_budget_and_goes_on_in_its_conversation(make_env, raw, prefix):
    # budget 1_700: the session member's second call of item 1 parks; the raise resumes it
    # in the same conversation (each item's prompt once), not from the item's start
    e = make_env(1)
    team = "e2e_budget_session"
    run_id = await e.submit(3, 1_700, team=team)
    outs = await e.drain()
    assert outs[-1] == "budget_reached", outs
    [parked] = await e.client.inbox(f"{team}::worker", "parked")
    assert [w.message_id for w in await e.client.budget_waits(team)] == [parked.id]
    assert (await e.client.get_run(run_id)).spent_tokens == 5 * CALL_TOKENS
    await e.client.raise_budget(run_id, tokens=20_000)
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed", record
    assert record.result.result == "final: answer0 | answer1 | answer2"
    assert record.spent_tokens == run_tokens(3)
    session_key = e.ctxs[0].keys.session(f"{team}::worker")
    prompts = [m for m in map(json.loads, raw.lrange(session_key, 0, -1)) if isinstance(m["content"], str)]
    assert len(prompts) == 3


@pytest.mark.parametrize("workers", [1, 3])
async def test_the_spend_is_the_same_on_one_worker_and_on_three(make_env, workers):
    e = make_env(workers)
    run_id = await e.submit(4, 2_000)
    await e.drain()
    parked = await e.client.get_run(run_id)
    assert parked.status.value == "budget_reached"
    assert parked.spent_tokens == 6 * CALL_TOKENS
    await e.client.raise_budget(run_id, tokens=100_000)
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed"
    assert record.spent_tokens == run_tokens(4)


@pytest.mark.parametrize("workers", [1, 3])
async def test_parallel_members_never_spend_more_than_one_call_past_the_budget(
    make_env, raw, prefix, workers
):
    # the lead asks six items at once (350 tokens); their twelve calls (350 each)
    # overlap. Checked only before each call, all six first calls went at once
    # (spend 2_450 > 2_000 + one call). Reserved, four fit (1_750), one more
    # goes alone past the budget (2_100), the others wait for it and park.
    await _parallel_run_parks_then_completes(make_env(workers), raw, prefix)


async def test_a_call_longer_than_its_reservation_keeps_it(make_env, raw, prefix, monkeypatch):
    # each member call takes 0.6 s, a reservation holds 0.3 s unless renewed:
    # the calls in flight renew theirs, so the waiting calls still wait
    import tests.e2e.budget_teams as budget_teams
    from lattice_worker.runtime.run import budget

    monkeypatch.setattr(budget, "RESERVATION_SECONDS", 0.3)
    monkeypatch.setattr(budget_teams, "MEMBER_CALL_SECONDS", 0.6)
    await _parallel_run_parks_then_completes(make_env(1), raw, prefix)


async def _parallel_run_parks_then_completes(e: Env, raw: Any, prefix: str) -> None:
    run_id = await e.submit(6, 2_000, team="e2e_budget_parallel")
    outs = await e.drain_parallel()
    assert outs.count("budget_reached") >= 1, outs
    record = await e.client.get_run(run_id)
    assert record.status.value == "budget_reached", (record, outs)
    assert 2_000 <= record.spent_tokens < 2_000 + CALL_TOKENS, record
    assert raw.zcard(record_key(prefix, run_id) + ":budget_calls") == 0  # every reservation released
    events = [ev for _, ev in await e.client.runs.events(run_id, count=1000)]
    waits = [ev for ev in events if ev.get("type") == "model_call_waiting"]
    assert waits and all(w["limit"] == "budget" and w["budget"] == {"tokens": 2_000} for w in waits)

    raised = await e.client.raise_budget(run_id, tokens=100_000)
    assert raised.resumed_messages and not raised.resumed_lead
    await e.drain_parallel()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed", record
    assert record.result.result == "final: " + " | ".join(f"answer{k}" for k in range(6))
    assert record.spent_tokens == parallel_run_tokens(6)


async def test_a_run_without_a_budget_counts_nothing_and_never_parks(make_env):
    e = make_env(1)
    run_id = await e.submit(2, None)
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed"
    assert record.budget_tokens is None and record.spent_tokens is None


async def test_bad_raises_are_refused_and_change_nothing(make_env, raw, prefix):
    e = make_env(1)
    with pytest.raises(RunNotFoundError):
        await e.client.raise_budget("run_nope", tokens=5_000)
    for bad in (0, -5, "100", 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            await e.client.raise_budget("run_nope", tokens=bad)
    # not reached yet: refused
    waiting = await e.submit(3, 50_000)
    with pytest.raises(BudgetError, match="has not reached its budget"):
        await e.client.raise_budget(waiting, tokens=60_000)
    assert raw.hget(record_key(prefix, waiting), "budget_tokens") == "50000"
    # no budget at all
    plain = await e.submit(1, None)
    with pytest.raises(BudgetError, match="has no budget"):
        await e.client.raise_budget(plain, tokens=60_000)
    e.queue.clear()
    # parked: a total not above the spend is refused, the run stays parked
    parked = await e.submit(3, 2_000)
    await e.drain()
    before = raw.hgetall(record_key(prefix, parked))
    assert before["status"] == "budget_reached"
    with pytest.raises(BudgetError, match="not above"):
        await e.client.raise_budget(parked, tokens=int(before["spent_tokens"]))
    assert raw.hgetall(record_key(prefix, parked)) == before
    assert e.queue == []
    # finished: refused
    await e.client.raise_budget(parked, tokens=100_000)
    await e.drain()
    assert (await e.client.get_run(parked)).status.value == "completed"
    with pytest.raises(BudgetError, match="completed"):
        await e.client.raise_budget(parked, tokens=200_000)


async def test_a_team_default_budget_applies_unless_the_run_has_its_own(make_env):
    e = make_env(1)
    defaulted = await e.submit(3, None, team="e2e_budget_default")
    own = await e.submit(3, 50_000, team="e2e_budget_default")
    await e.drain()
    record = await e.client.get_run(defaulted)
    assert record.status.value == "budget_reached"
    assert record.budget_tokens == 2_000 and record.spent_tokens == 6 * CALL_TOKENS
    other = await e.client.get_run(own)
    assert other.status.value == "completed" and other.budget_tokens == 50_000
    assert other.spent_tokens == run_tokens(3)
    await e.client.raise_budget(defaulted, tokens=4_000)
    await e.drain()
    record = await e.client.get_run(defaulted)
    assert record.status.value == "completed" and record.budget_tokens == 4_000


def test_create_team_refuses_a_bad_budget():
    from lattice_worker.errors import ConfigError
    from tests.e2e.budget_teams import build_team

    for bad in ({"tokens": 0}, {"tokens": "5"}, {"usd": 1}, 5):
        with pytest.raises(ConfigError, match="budget"):
            build_team("e2e_bad", bad)


async def test_submit_checks_the_budget(prefix):
    client = AsyncLatticeClient(broker_url=REDIS_URL, key_prefix=prefix)
    try:
        for bad in ({"tokens": 0}, {"tokens": "5"}, {"dollars": 5}, {"tokens": 5, "x": 1}, 5):
            with pytest.raises(ValueError, match="budget"):
                await client.submit(TEAM, "1", budget=bad, require_registered=False)
        assert await client.runs.list_runs() == []
    finally:
        await client.aclose()


def record_key(prefix: str, run_id: str) -> str:
    return f"{prefix}:run:{{run:{run_id}}}"


async def test_the_cli_shows_the_spend_and_raises_the_budget(make_env, prefix):
    from lattice_client.cli import EXIT_ERROR

    lattice = cli_runner(prefix)
    e = make_env(1)
    run_id = await e.submit(3, 2_000)
    await e.drain()
    shown = lattice("status")
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if run_id in line)
    assert "budget_reached" in row and f"{6 * CALL_TOKENS}/2000" in row
    refused = lattice("budget", run_id, "--tokens", "2000")
    assert refused.exit_code == EXIT_ERROR
    assert "not above" in refused.output and "new total" in refused.output
    assert lattice("budget", "run_nope", "--tokens", "5000").exit_code == EXIT_ERROR
    assert (await e.client.get_run(run_id)).status.value == "budget_reached"  # nothing changed
    raised = lattice("budget", run_id, "--tokens", "9000")
    assert raised.exit_code == 0, raised.output
    assert f"budget 2000 -> 9000 tokens ({6 * CALL_TOKENS} spent); resumed: the lead" in raised.output
    # the CLI sent resume_lead through the broker; this in-process worker runs it
    assert await lead_segment.resume_lead(e.ctxs[0], run_id) in ("suspended", "completed")
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed" and record.spent_tokens == run_tokens(3)


def cli_runner(prefix: str) -> Any:
    """``lattice(*args)``: the CLI on the tests' Redis and ``prefix``, 200 columns wide."""
    from typer.testing import CliRunner

    from lattice_client.cli import app

    def lattice(*args: str) -> Any:
        result = CliRunner().invoke(
            app, ["--broker-url", REDIS_URL, "--key-prefix", prefix, *args], env={"COLUMNS": "200"}
        )
        assert "Traceback" not in result.output, result.output
        return result

    return lattice


async def test_work_parked_at_the_budget_shows_in_parked_and_status(make_env, prefix):
    e = make_env(1)
    lead_parked = await e.submit(3, 2_000)  # the lead's next call parks
    member_parked = await e.submit(3, 1_700)  # a member's call parks with its message
    await e.drain()
    [message] = await e.client.inbox(f"{TEAM}::worker", "parked")
    waits = sorted(
        await e.client.budget_waits(), key=lambda w: w.member
    )  # (oldest first: whichever parked first)
    assert [(w.kind, w.run_id, w.team, w.member, w.message_id) for w in waits] == [
        ("budget", lead_parked, TEAM, "lead", None),
        ("budget", member_parked, TEAM, "worker", message.id),
    ]
    assert [(w.spent_tokens, w.budget_tokens) for w in waits] == [
        (6 * CALL_TOKENS, 2_000),
        (5 * CALL_TOKENS, 1_700),
    ]
    assert waits[1].work_item_id == message.work_item_id and all(w.created_at > 0 for w in waits)
    assert await e.client.budget_waits("other-team") == []
    assert await e.client.parked() == []  # not tool calls: resolve does not decide them
    status = await e.client.status(TEAM)
    assert {w.run_id for w in status.budget_waits} == {lead_parked, member_parked}

    lattice = cli_runner(prefix)
    listed = lattice("parked", TEAM, "--json")
    assert listed.exit_code == 0, listed.output
    assert sorted(
        (p["kind"], p["member"], p["run_id"], p["message_id"]) for p in json.loads(listed.output)
    ) == [
        ("budget", "lead", lead_parked, None),
        ("budget", "worker", member_parked, message.id),
    ]
    for shown in (lattice("parked"), lattice("status", TEAM)):
        assert shown.exit_code == 0, shown.output
        assert "parked at the run's token budget (lattice budget RUN_ID --tokens N)" in shown.output
        rows = [line for line in shown.output.splitlines() if "lead" in line or message.id in line]
        assert any(lead_parked in r and f"{6 * CALL_TOKENS}/2000" in r for r in rows), shown.output
        assert any(member_parked in r and f"{5 * CALL_TOKENS}/1700" in r for r in rows), shown.output

    # so does the operations page's calls page
    html = await asyncio.to_thread(ui_html, prefix, "/calls")
    [table] = re.findall(r'<table class="list" id="budget-waits">.*?</table>', html, re.S)
    assert lead_parked in table and member_parked in table and message.id in table
    assert f"{6 * CALL_TOKENS} / 2000" in table and f"{5 * CALL_TOKENS} / 1700" in table

    # a team's reference a live worker serves lists the same (it read as an unknown team, told to add ':team')
    ref = "tests.e2e.budget_teams:team"
    publish_fake_worker(prefix, {ref: TEAM})
    assert {w.run_id for w in await e.client.budget_waits(ref)} == {lead_parked, member_parked}
    assert await e.client.parked(ref) == []
    by_ref = lattice("parked", ref, "--json")
    assert by_ref.exit_code == 0, by_ref.output
    assert sorted(p["run_id"] for p in json.loads(by_ref.output)) == sorted([lead_parked, member_parked])
    unserved = lattice("parked", "tests.e2e.budget_teams:nope")
    assert unserved.exit_code == 1 and "no live worker" in unserved.output, unserved.output
    assert "a reference needs ':attribute'" not in unserved.output
    with pytest.raises(ValueError, match="no live worker"):
        await e.client.budget_waits("tests.e2e.budget_teams:nope")
    with pytest.raises(TypeError, match="team must be a team name or reference"):
        await e.client.budget_waits(5)  # type: ignore[arg-type]

    # raised, the member's run goes on: no longer listed; the parked lead still is
    await e.client.raise_budget(member_parked, tokens=50_000)
    assert [w.run_id for w in await e.client.budget_waits()] == [lead_parked]
    await e.drain()
    await e.client.cancel(lead_parked)  # a finished run's lead is not waiting any more
    assert await e.client.budget_waits() == []
    assert lattice("parked").output.strip() == "no parked calls and no work parked at a budget"
    assert 'id="budget-waits"' not in await asyncio.to_thread(ui_html, prefix, "/calls")


async def test_a_run_parked_on_its_budget_can_be_cancelled(make_env):
    e = make_env(1)
    lead_parked = await e.submit(3, 2_000)
    member_parked = await e.submit(3, 1_700)
    await e.drain()
    for run_id in (lead_parked, member_parked):
        assert (await e.client.get_run(run_id)).status.value == "budget_reached"
        report = await e.client.cancel(run_id)
        assert report.status.value == "cancelled"
        assert (await e.client.wait(run_id, timeout=5)).status == "cancelled"
    # the member's parked message was cancelled with its run; nothing is left to raise
    assert [m.status.value for m in await e.client.inbox("e2e_budget::worker", "parked")] == []
    with pytest.raises(BudgetError, match="cancelled"):
        await e.client.raise_budget(member_parked, tokens=50_000)
    assert e.queue == []


async def test_a_raise_that_stopped_half_way_is_finished_by_the_next(make_env):
    e = make_env(1)
    run_id = await e.submit(3, 1_700)  # a member parks
    await e.drain()
    # the first raise's script ran, then its caller died before moving the message on
    first = await e.client.runs.raise_budget(run_id, 20_000)
    assert not first.resume_lead and len(first.waits) == 1
    assert (await e.client.get_run(run_id)).status.value == "suspended"
    assert [m.status.value for m in await e.client.inbox("e2e_budget::worker", "parked")] == ["parked"]
    again = await e.client.raise_budget(run_id, tokens=20_000)
    assert again.resumed_messages == [first.waits[0]["message_id"]]
    # nothing is left to move on: a raise is refused again (not reached)
    with pytest.raises(BudgetError, match="has not reached"):
        await e.client.raise_budget(run_id, tokens=30_000)
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed" and record.spent_tokens == run_tokens(3)


async def test_a_lead_stopped_in_a_compaction_summary_still_registers_its_batch(make_env, caplog):
    # the first lead call spends 350 >= 300; the compaction after its tool batch is a
    # call too: the gate refuses it (the summary fails quietly), the batch's ask is
    # registered under the lead's lease and the run suspends; the member parks
    e = make_env(1)
    run_id = await e.submit(1, 300, team="e2e_budget_compact")
    with caplog.at_level("WARNING", logger="lattice_worker.agent"):
        outs = await e.drain()
    assert outs == ["suspended", "budget_reached"], outs
    assert "the summary request failed" in caplog.text  # the gate refused the summary call
    record = await e.client.get_run(run_id)
    assert record.status.value == "budget_reached" and record.spent_tokens == CALL_TOKENS
    raised = await e.client.raise_budget(run_id, tokens=10_000)
    assert len(raised.resumed_messages) == 1
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed", record
    assert record.result.result == "final: answer0"
    assert record.spent_tokens == run_tokens(1)


async def test_of_two_concurrent_raises_to_different_totals_one_is_refused(make_env, raw, prefix):
    # a member parked; two raises at once: the second ran its script while the
    # first was still moving the member's message on. It used to be accepted
    # and replace the total the first had just reported (both "succeeded").
    e = make_env(1)
    run_id = await e.submit(3, 1_700)
    await e.drain()
    results = await asyncio.gather(
        e.client.raise_budget(run_id, tokens=20_000),
        e.client.raise_budget(run_id, tokens=5_000),
        return_exceptions=True,
    )
    raised = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(raised) == 1 and len(refused) == 1, results
    # refused while the first moves the message on, or (had it finished) as not reached
    assert isinstance(refused[0], BudgetError), refused
    assert "being moved on" in str(refused[0]) or "has not reached" in str(refused[0])
    [winner] = raised
    assert raw.hget(record_key(prefix, run_id), "budget_tokens") == str(winner.budget_tokens)
    assert len(winner.resumed_messages) == 1
    assert e.queue == [(DELIVER_TASK, ["e2e_budget::worker", winner.resumed_messages[0]])]
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed" and record.budget_tokens == winner.budget_tokens
    assert record.spent_tokens == run_tokens(3)


async def test_a_raise_left_half_way_refuses_another_total_and_changes_nothing(make_env, raw, prefix):
    e = make_env(1)
    run_id = await e.submit(3, 1_700)
    await e.drain()
    await e.client.runs.raise_budget(run_id, 20_000)  # its caller stopped before moving the message
    before = raw.hgetall(record_key(prefix, run_id))
    with pytest.raises(BudgetError, match="tokens=20000 to finish it"):
        await e.client.raise_budget(run_id, tokens=30_000)
    assert raw.hgetall(record_key(prefix, run_id)) == before and e.queue == []
    assert (await e.client.raise_budget(run_id, tokens=20_000)).resumed_messages


async def test_a_raise_between_the_members_park_and_its_message_park_resumes_it(make_env, raw, prefix):
    # the member's park script ran (the run is budget_reached, a watcher sees it)
    # and a raise ran before the member moved its message to "parked": the raise
    # saw the message still processing. It used to drop the wait and move
    # nothing: the message parked with no wait, the run suspended under its new
    # budget, every later raise refused ("not reached") -- stuck until cancelled.
    e = make_env(1)
    run_id = await e.submit(3, 1_700)
    mailbox = e.ctxs[0].mailbox
    real_complete = mailbox.complete
    raised: list[Any] = []

    async def complete(message_id: str, token: str, status: Any) -> Any:
        if str(status) == "parked" and not raised:
            assert (await e.client.get_run(run_id)).status.value == "budget_reached"
            raised.append(await e.client.raise_budget(run_id, tokens=20_000))
        return await real_complete(message_id, token, status)

    mailbox.complete = complete  # the raise runs in the gap, against the real stores
    await e.drain()
    assert raised and raised[0].resumed_messages == []  # it found the message still processing
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed", record
    assert record.result.result == "final: answer0 | answer1 | answer2"
    assert record.spent_tokens == run_tokens(3)
    assert raw.hlen(record_key(prefix, run_id) + ":budget_waits") == 0


async def test_a_raise_never_releases_a_claim_taken_after_it_read_the_message(make_env, prefix):
    # the raise read the member's message "parked"; before it moved it, the
    # message was moved back (another raise, or its member) and a worker claimed
    # it. The raise's move to "pending" used to release that claim (processing
    # -> pending is allowed) and ring a second doorbell; now it moves only from "parked".
    e = make_env(1)
    run_id = await e.submit(1, 600, team="e2e_budget_parallel")  # the member's second call parks
    await e.drain()
    [parked] = await e.client.inbox("e2e_budget_parallel::worker", "parked")
    mailbox = e.client.mailbox
    real_get = mailbox.get

    async def meanwhile() -> Any:  # moved on by someone else, claimed by a worker
        await mailbox.update_status(parked.id, "pending")
        step = asyncio.ensure_future(member_step.deliver(e.ctxs[0], parked.to, parked.id))
        for _ in range(5_000):  # until the worker holds its claim (its model call takes 50 ms)
            if (await real_get(parked.id)).status.value == "processing":
                break
            await asyncio.sleep(0.001)
        return step

    get, claims = stale_get(mailbox, parked.id, meanwhile)  # the raise reads it "parked"
    mailbox.get = get
    raised = await e.client.raise_budget(run_id, tokens=50_000)
    mailbox.get = real_get
    assert raised.resumed_messages == [] and e.queue == []  # no second doorbell
    held = await real_get(parked.id)
    assert held.status.value == "processing" and held.claimed_by, held  # the claim holds
    assert await claims[0] in ("done", "completed"), claims
    await e.drain()
    record = await e.client.get_run(run_id)
    assert record.status.value == "completed", record
    assert record.result.result == "final: answer0"
    assert record.spent_tokens == parallel_run_tokens(1)


async def test_lattice_wait_says_once_that_the_run_waits_at_its_budget(make_env, prefix, monkeypatch):
    from typer.testing import CliRunner

    from lattice_client.cli import app
    from lattice_client.cli import runs as cli_runs

    monkeypatch.setattr(cli_runs, "HINT_POLL_SECONDS", 0.2)
    e = make_env(1)
    run_id = await e.submit(3, 2_000)
    await e.drain()
    assert (await e.client.get_run(run_id)).status.value == "budget_reached"
    waited = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["--broker-url", REDIS_URL, "--key-prefix", prefix, "wait", run_id, "--timeout", "1.5"],
        env={"COLUMNS": "300"},
    )
    assert waited.exit_code == 3, waited.output  # it timed out: the run still waits
    hint = f"run {run_id} is parked at its budget ({6 * CALL_TOKENS} of 2000 tokens spent)"
    assert waited.output.count(hint) == 1, waited.output
    assert (
        f"lattice --broker-url {REDIS_URL} --key-prefix {prefix} budget {run_id} --tokens N" in waited.output
    )
    assert "did not finish within 1.5 s" in waited.output
    assert (await e.client.get_run(run_id)).status.value == "budget_reached"  # nothing changed


async def test_a_message_parked_at_the_budget_says_so_to_resolve_and_to_lattice_events(make_env, prefix):
    from typer.testing import CliRunner

    from lattice_client import DecisionError
    from lattice_client.cli import app

    # budget 1_700: the member's second call of item 1 parks its message (as above)
    e = make_env(1)
    run_id = await e.submit(3, 1_700)
    await e.drain()
    assert (await e.client.get_run(run_id)).status.value == "budget_reached"
    [parked] = [m for m in await e.client.inbox(f"{TEAM}::worker", "all") if m.status.value == "parked"]
    # not a parked tool call: resolve points at the budget (before: "is not a parked call (status parked)")
    with pytest.raises(
        DecisionError, match=f"parked at run {run_id}'s token budget.*lattice budget {run_id}"
    ):
        await e.client.resolve(parked.id, retry=True)
    assert (await e.client.get_run(run_id)).status.value == "budget_reached"  # nothing changed

    # lattice events streams until the result: it says why the stream stopped
    streamed = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        ["--broker-url", REDIS_URL, "--key-prefix", prefix, "events", run_id, "--timeout", "1"],
        env={"COLUMNS": "300"},
    )
    assert streamed.exit_code == 3, streamed.output  # timed out: the run still waits
    hint = f"run {run_id} parked at its budget ({5 * CALL_TOKENS} of 1700 tokens spent)"
    assert streamed.output.count(hint) == 1, streamed.output
    assert (
        f"lattice --broker-url {REDIS_URL} --key-prefix {prefix} budget {run_id} --tokens N"
        in streamed.output
    )
