"""The Redis round trips of one handoff, pinned.

One handoff: the lead's first step (``run_lead``) hands a task to a member and
suspends, the member's step (``deliver``) answers, the lead resumes
(``resume_lead``) and ends the run. The step bodies run in the test's loop on
the real Redis (the tasks they enqueue are collected and run by the test). Every
request the runtime's asyncio Redis clients write is counted at
``Connection.send_packed_command`` (redis-py's public connection method: one
call per command, or per pipeline, is one round trip); a health-check ``PING``
(sent only on a connection idle for a second) is not counted, so load on the
machine does not move the figure.

The pinned numbers are the runtime's share of a step (issue 20): a change that
adds a sequential request fails here. Lowering them is welcome; update the pins.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from typing import Any

import pytest
import redis.asyncio.connection as aconn

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK
from lattice_client.runstore import RunStore
from lattice_client.settings import get_settings
from lattice_mailbox.redis import RedisMailbox
from lattice_worker.runtime.lead import segment as lead_segment
from lattice_worker.runtime.member import step as member_step
from lattice_worker.runtime.run.context import WorkerContext
from lattice_worker.runtime.worker.registry import TeamRegistry
from tests.e2e.teams import plan
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

ROUND_TRIPS = {RUN_LEAD_TASK: 5, DELIVER_TASK: 5, RESUME_LEAD_TASK: 2}
"""Redis round trips per step of one handoff (the figure issue 20 asks to cut).

The resumed lead marks the reports it read ``done`` with its segment's next
write (one round trip fewer: it was an ``EVALSHA`` of its own before).

The ``lead_segment`` event (the segment's worker, for the operations page's
timeline) joins the segment's next batch in both lead steps: the run record
``begin_segment`` read names the run's parent, so the event needs no read of
it (it took run_lead a sixth round trip, an ``HGETALL`` of the record, before)."""

_BODIES = {
    RUN_LEAD_TASK: lead_segment.run_lead,
    DELIVER_TASK: member_step.deliver,
    RESUME_LEAD_TASK: lead_segment.resume_lead,
}


def _names(packed: Any) -> list[str]:
    """The command names of one request (a pipeline has several; a script call shows its first key)."""
    data = b"".join(packed) if isinstance(packed, (list, tuple)) else bytes(packed)
    names = []
    for match in re.finditer(rb"\*(\d+)\r\n\$\d+\r\n([A-Za-z]+)\r\n", data):
        name = match.group(2).decode().upper()
        if name in ("EVALSHA", "EVAL", "FCALL"):
            rest = data[match.end() :].split(b"\r\n")
            name += f"({rest[5].decode(errors='replace')})" if len(rest) > 5 else ""
        names.append(name)
    return names


class RoundTrips:
    """Counts the requests written by every asyncio Redis connection while ``step`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.step: str | None = None
        self.counts: Counter[str] = Counter()
        self.requests: list[str] = []
        original = aconn.AbstractConnection.send_packed_command
        counter = self

        async def counted(conn: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
            names = _names(command)
            if counter.step is not None and names != ["PING"]:
                counter.counts[counter.step] += 1
                counter.requests.append(f"{counter.step}: {'+'.join(names)}")
            return await original(conn, command, *args, **kwargs)

        monkeypatch.setattr(aconn.AbstractConnection, "send_packed_command", counted)


@pytest.fixture
async def deployment(prefix: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LATTICE_KEY_PREFIX", prefix)  # where the test team's tools record
    settings = get_settings(key_prefix=prefix, broker_url=REDIS_URL, mailbox_url=REDIS_URL)
    mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
    registry = TeamRegistry(mailbox)
    registry.load("tests.e2e.teams:team")
    runs = RunStore(REDIS_URL, prefix)
    sent: list[tuple[str, list[Any]]] = []
    ctx = WorkerContext(
        settings=settings,
        registry=registry,
        mailbox=mailbox,
        runs=runs,
        send_task=lambda name, args, queue: sent.append((name, args)),
    )
    yield ctx, sent
    await ctx.aclose()
    await mailbox.aclose()


async def _handoff(ctx: WorkerContext, sent: list[tuple[str, list[Any]]], counter: RoundTrips | None) -> str:
    run_id = f"run_{uuid.uuid4().hex[:10]}"
    await ctx.runs.create(run_id, "e2e", plan(("worker", "handoff", "a")))
    sent.append((RUN_LEAD_TASK, [run_id]))
    outcomes = []
    while sent:
        name, args = sent.pop(0)
        if counter is not None:
            counter.step = name
        try:
            outcomes.append((name, await _BODIES[name](ctx, *args)))
            await ctx.writer.flush()  # what the task wrapper does before the task ends
        finally:
            if counter is not None:
                counter.step = None
    assert [n for n, _ in outcomes] == [RUN_LEAD_TASK, DELIVER_TASK, RESUME_LEAD_TASK], outcomes
    return run_id


async def test_one_handoff_takes_the_pinned_number_of_redis_round_trips(deployment, monkeypatch):
    ctx, sent = deployment
    await _handoff(ctx, sent, None)  # warm-up: the once-per-process work (clients, scripts loaded)
    counter = RoundTrips(monkeypatch)
    run_id = await _handoff(ctx, sent, counter)
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    # the member's report, read by the resumed lead, is marked done (with the resume's last write)
    lead_inbox = await ctx.mailbox.inbox("e2e::lead", status="all")
    assert lead_inbox and {m.status.value for m in lead_inbox} == {"done"}
    assert dict(counter.counts) == ROUND_TRIPS, (
        f"Redis round trips per step of one handoff: {dict(counter.counts)} "
        f"(total {sum(counter.counts.values())}); pinned {ROUND_TRIPS} (total {sum(ROUND_TRIPS.values())}):\n"
        + "\n".join(counter.requests)
    )
