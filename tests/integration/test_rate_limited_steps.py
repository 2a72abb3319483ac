"""Model calls of the distributed steps under the shared rate limits (issue 22), against the real Redis.

The task bodies run in the test's event loop; the tasks they enqueue are
collected with their Celery ``countdown`` by a fake sender and run by the test.
The limits use a short ``period_seconds`` so a turn comes within seconds; the
tests assert what happens (re-enqueued, not run early, place kept), never how long.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest
from typer.testing import CliRunner

from lattice_client import LatticeClient
from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK
from lattice_client.cli import app
from lattice_client.runstore import RunStore
from lattice_mailbox.redis import RedisMailbox
from lattice_worker.agent.anthropic_client import DEFAULT_MODEL, AnthropicModelClient
from lattice_worker.agent.model import ModelRequest
from lattice_worker.runtime.lead import segment as lead_segment
from lattice_worker.runtime.limits.bucket import waiting_calls
from lattice_worker.runtime.limits.gate import CallScope, LimitedModelClient, RateLimitWait, current_scope
from lattice_worker.runtime.limits.hook import limiter_for
from lattice_worker.runtime.member import step as member_step
from lattice_worker.runtime.run.context import WorkerContext
from lattice_worker.runtime.worker.registry import TeamRegistry
from tests.e2e.teams import plan
from tests.support.fake_anthropic import ErrorReply, MessageReply, text_block
from tests.support.services import REDIS_URL, settings_for
from tests.support.ui_page import ui_html

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

LIMITS = {"*": {"requests_per_minute": 2, "period_seconds": 4}}
"""Two requests per 4 s: one more every 2 s (a call past them waits longer than a step sleeps)."""


class Broker:
    """Collects the tasks the bodies enqueue (with their countdown) and runs them."""

    def __init__(self) -> None:
        self.ctx: WorkerContext | None = None
        self.queue: list[tuple[str, list[Any], float | None]] = []

    def send(self, name: str, args: list[Any], queue: str, countdown: float | None = None) -> None:
        self.queue.append((name, args, countdown))

    async def run(self, name: str, args: list[Any]) -> str:
        assert self.ctx is not None
        if name == RUN_LEAD_TASK:
            return await lead_segment.run_lead(self.ctx, args[0])
        if name == RESUME_LEAD_TASK:
            return await lead_segment.resume_lead(self.ctx, args[0])
        return await member_step.deliver(self.ctx, *args)

    def take(self) -> tuple[str, list[Any], float | None]:
        return self.queue.pop(0)


@pytest.fixture
async def env(prefix, monkeypatch):
    monkeypatch.setenv("LATTICE_KEY_PREFIX", prefix)  # where the teams' work tool counts its executions
    settings = settings_for(prefix, lease_seconds=5, model_limits=LIMITS)
    mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
    registry = TeamRegistry(mailbox)
    registry.load("tests.e2e.teams:team")
    runs = RunStore(REDIS_URL, prefix)
    broker = Broker()
    ctx = WorkerContext(
        settings=settings, registry=registry, mailbox=mailbox, runs=runs, send_task=broker.send
    )
    broker.ctx = ctx
    yield ctx, broker
    await ctx.writer.aclose()
    await runs.aclose()
    await mailbox.aclose()


async def submit(ctx: WorkerContext, broker: Broker, prompt: str) -> str:
    run_id = f"run_{uuid.uuid4().hex[:10]}"
    await ctx.runs.create(run_id, "e2e", prompt)
    broker.send(RUN_LEAD_TASK, [run_id], "lead")
    return run_id


async def use_up(ctx: WorkerContext, calls: int) -> None:
    """Another worker's calls take ``calls`` turns of the same key first."""
    limiter = limiter_for(ctx)
    for _ in range(calls):
        await limiter.reserve(DEFAULT_MODEL, None, 1)


def lattice_status(prefix: str, *more: str) -> str:
    result = CliRunner().invoke(
        app, ["--broker-url", REDIS_URL, "--key-prefix", prefix, "status", *more], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    return result.output


def client_rate_limited(prefix: str) -> list[Any]:
    with LatticeClient(broker_url=REDIS_URL, key_prefix=prefix) as client:
        return client.rate_limited()


async def event_types(ctx: WorkerContext, run_id: str) -> list[dict[str, Any]]:
    return [e for _, e in await ctx.runs.events(run_id, count=1000)]


async def test_a_lead_call_over_the_limit_ends_the_segment_and_is_not_run_early(env, raw, prefix):
    ctx, broker = env
    await use_up(ctx, 2)
    run_id = await submit(ctx, broker, "hello")
    assert await broker.run(*broker.take()[:2]) == "rate_limited"

    record = await ctx.runs.get(run_id)
    assert record.status.value == "resuming"  # no lease held while it waits
    assert raw.hget(f"{prefix}:run:{{run:{run_id}}}", "lease_token") is None
    name, args, countdown = broker.take()
    assert (name, args) == (RESUME_LEAD_TASK, [run_id]) and countdown is not None and countdown > 1
    events = await event_types(ctx, run_id)
    waits = [e for e in events if e.get("type") == "model_call_waiting"]
    assert waits and waits[-1]["limit"] == "requests_per_minute" and waits[-1]["requeued"] is True
    assert not [e for e in events if e.get("type") == "assistant"]  # the model was not called
    client = await ctx.redis()
    [waiting] = await waiting_calls(client, prefix)
    assert waiting["waiting"] == 1 and waiting["limit"] == "requests_per_minute"
    # lattice status shows it, naming the limit
    shown = await asyncio.to_thread(lattice_status, prefix)
    assert "model calls waiting for their turn" in shown and "requests_per_minute" in shown
    report = json.loads(await asyncio.to_thread(lattice_status, prefix, "--json"))
    assert [(w["waiting"], w["limit"]) for w in report["rate_limited"]] == [(1, "requests_per_minute")]
    # so do the client and the operations page's workers page
    [listed] = await asyncio.to_thread(client_rate_limited, prefix)
    assert (listed.model, listed.waiting, listed.limit) == (DEFAULT_MODEL, 1, "requests_per_minute")
    page = await asyncio.to_thread(ui_html, prefix, "/workers")
    assert 'id="rate-limited"' in page and DEFAULT_MODEL in page and "requests_per_minute" in page

    # an early resume (a reaper's, a duplicate) finds the held place: it waits again, takes no new turn
    assert await broker.run(RESUME_LEAD_TASK, [run_id]) == "rate_limited"
    _, _, again = broker.take()
    assert again is not None and again <= countdown
    [waiting] = await waiting_calls(client, prefix)
    assert waiting["waiting"] == 1
    assert not [e for e in await event_types(ctx, run_id) if e.get("type") == "assistant"]

    await asyncio.sleep(again)  # its turn
    assert await broker.run(RESUME_LEAD_TASK, [run_id]) == "completed"
    record = await ctx.runs.get(run_id)
    assert record.result.result == "direct: hello"
    assert await waiting_calls(client, prefix) == []


async def test_a_member_call_over_the_limit_gives_its_claim_back_and_keeps_its_place(env, raw, prefix):
    ctx, broker = env
    run_id = await submit(ctx, broker, plan(("worker", "handoff", "a")))
    assert await broker.run(*broker.take()[:2]) == "suspended"  # the lead's call had a turn
    await use_up(ctx, 2)
    name, args, _ = broker.take()
    assert name == DELIVER_TASK
    assert await broker.run(name, args) == "rate_limited"

    [message] = await ctx.mailbox.inbox(args[0], "all")
    assert message.status.value == "pending"  # released: no claim, no lease while it waits
    assert raw.get(f"{prefix}:test:exec:a") is None  # the member's first call did not run
    name, args2, countdown = broker.take()
    assert name == DELIVER_TASK and args2 == [args[0], message.id] and countdown is not None and countdown > 1
    waits = [e for e in await event_types(ctx, run_id) if e.get("type") == "model_call_waiting"]
    assert waits[-1]["member"] == "worker" and waits[-1]["work_item_id"] == message.work_item_id

    # a doorbell without a message id (the reaper's, for a message pending a while) leaves it alone
    assert await broker.run(DELIVER_TASK, [args[0]]) == "idle"
    [message] = await ctx.mailbox.inbox(args[0], "all")
    assert message.status.value == "pending" and message.attempts == 1
    assert await broker.run(name, args2) == "rate_limited"  # early: still not its turn
    assert raw.get(f"{prefix}:test:exec:a") is None
    _, args3, again = broker.take()
    assert again <= countdown

    deadline = time.monotonic() + 40
    outcome = None
    while broker.queue or outcome is None:  # every step runs at its turn
        assert time.monotonic() < deadline
        if not broker.queue:
            broker.queue.append((DELIVER_TASK, args3, again))
        name, args, countdown = broker.take()
        if countdown:
            await asyncio.sleep(countdown)
        outcome = await broker.run(name, args)
    record = await ctx.runs.get(run_id)
    assert record.status.value == "completed"
    assert record.result.result == "final: done:worked[a]"
    assert raw.get(f"{prefix}:test:exec:a") == "1"


async def test_under_drain_a_member_call_over_the_limit_waits_in_place(env, raw, prefix):
    from lattice_worker.runtime.limits.hook import waits_in_place

    ctx, broker = env
    run_id = await submit(ctx, broker, plan(("worker", "handoff", "d")))
    assert await broker.run(*broker.take()[:2]) == "suspended"
    await use_up(ctx, 2)
    _, args, _ = broker.take()
    team = ctx.registry.get("e2e")
    member = ctx.registry.member("e2e", "worker")
    message = await member_step.claim_startable(ctx, args[0], member_step.member_mode(member))
    with waits_in_place():  # lattice drain: no worker comes back for it
        assert await member_step.process_claimed(ctx, team, member, message) == "done"
    assert raw.get(f"{prefix}:test:exec:d") == "1"
    assert not [q for q in broker.queue if q[0] == DELIVER_TASK]  # nothing re-enqueued
    waits = [e for e in await event_types(ctx, run_id) if e.get("type") == "model_call_waiting"]
    assert waits and not any(w["requeued"] for w in waits)


async def test_a_session_member_call_over_the_limit_waits_in_place_holding_its_claim(env, raw, prefix):
    # a session member's message handed back to wait would let the next item of its
    # serial mailbox into the conversation: its call waits for its turn in place
    ctx, broker = env
    ctx.registry.load("tests.e2e.teams:session_team")
    run_id = f"run_{uuid.uuid4().hex[:10]}"
    await ctx.runs.create(run_id, "e2e_session", plan(("clerk", "handoff", "s")))
    assert await lead_segment.run_lead(ctx, run_id) == "suspended"
    await use_up(ctx, 2)
    [(name, args, _)] = broker.queue
    broker.queue.clear()
    assert await broker.run(name, args) == "done"
    assert raw.get(f"{prefix}:test:exec:s") == "1"
    assert not [q for q in broker.queue if q[0] == DELIVER_TASK]  # nothing re-enqueued
    [message] = await ctx.mailbox.inbox(args[0], "all")
    assert (message.status.value, message.attempts) == ("done", 1)  # one claim: never released
    waits = [e for e in await event_types(ctx, run_id) if e.get("type") == "model_call_waiting"]
    assert waits and not any(w["requeued"] for w in waits)


def request(text: str = "hi", *, stream: bool = False) -> ModelRequest:
    return ModelRequest(
        model="m", system=None, messages=[{"role": "user", "content": text}], max_tokens=16, stream=stream
    )


async def test_a_429_with_retry_after_lowers_the_shared_bucket_for_another_workers_next_call(prefix, server):
    import redis.asyncio as aioredis

    from lattice_client.model_limits import ModelLimit
    from lattice_worker.runtime.limits.bucket import RateLimiter

    clients = [aioredis.Redis.from_url(REDIS_URL, decode_responses=True) for _ in range(2)]

    def worker(client: Any) -> LimitedModelClient:
        async def redis() -> Any:
            return client

        limiter = RateLimiter(redis, prefix, {"m": ModelLimit(requests_per_minute=600)})
        sdk_client = AnthropicModelClient(api_key="key-1", base_url=server.url)
        return LimitedModelClient(sdk_client, limiter)

    a, b = worker(clients[0]), worker(clients[1])
    try:
        server.enqueue(
            ErrorReply(429, "rate_limit_error", "slow down", headers={"retry-after": "3"}),
            MessageReply([text_block("after")]),
        )
        first = asyncio.ensure_future(a.create_message(request()))  # refused, waits 3 s, goes again
        while not server.requests:  # noqa: ASYNC110 - the server runs in another thread
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        # the other worker's next call, in a step that may end: it is told to wait for the retry-after
        scope = CallScope(run_id="r1", scope="lead", emit=None, suspendable=True)
        token = current_scope.set(scope)
        try:
            with pytest.raises(RateLimitWait) as waited:
                await b.create_message(request())
        finally:
            current_scope.reset(token)
        assert waited.value.wait.seconds > 1.5 and waited.value.wait.limit == "requests_per_minute"
        assert len(server.requests) == 1  # b sent nothing
        message = await first
        assert message.content[0]["text"] == "after"
        assert len(server.requests) == 2  # one refusal, one retry: no SDK retry storm
    finally:
        for c in clients:
            await c.aclose()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_ratelimit_remaining_headers_lower_the_shared_bucket(prefix, server, stream):
    import redis.asyncio as aioredis

    from lattice_client.model_limits import ModelLimit
    from lattice_worker.runtime.limits.bucket import RateLimiter

    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)

    async def redis() -> Any:
        return client

    limiter = RateLimiter(redis, prefix, {"m": ModelLimit(requests_per_minute=60)})
    limited = LimitedModelClient(AnthropicModelClient(api_key="key-2", base_url=server.url), limiter)
    try:
        server.enqueue(
            MessageReply([text_block("ok")], headers={"anthropic-ratelimit-requests-remaining": "0"})
        )
        message = await limited.create_message(request(stream=stream))
        assert message.content[0]["text"] == "ok" and server.requests[-1].stream is stream
        # configured: 60 a minute, one used; the provider says none is left: the next call waits
        nxt = await limiter.reserve("m", "key-2", 1)
        assert nxt.wait_seconds > 0.5 and nxt.limit == "requests_per_minute"
    finally:
        await client.aclose()


class Scripted:
    """A LimitedModelClient over a ScriptedModelClient (its requests in ``calls``),
    30 requests a minute for model ``m`` under ``key``, on the test's Redis."""

    def __init__(self, client: Any, prefix: str, key: str) -> None:
        from lattice_client.model_limits import ModelLimit
        from lattice_worker import AssistantModelMessage, ScriptedModelClient
        from lattice_worker.runtime.limits.bucket import RateLimiter

        async def redis() -> Any:
            return client

        self.calls: list[Any] = []

        def model(req: Any) -> Any:
            self.calls.append(req)
            return AssistantModelMessage(content=[{"type": "text", "text": "ok"}], stop_reason="end_turn")

        self.key = key
        self.limiter = RateLimiter(redis, prefix, {"m": ModelLimit(requests_per_minute=30)})  # one every 2 s
        self.client = LimitedModelClient(ScriptedModelClient(model), self.limiter, api_key=key)

    async def use_up(self) -> None:
        """Another worker used the minute's 30 turns."""
        for _ in range(30):
            await self.limiter.reserve("m", self.key, 1)


@pytest.fixture
async def scripted(prefix):
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        yield lambda key: Scripted(client, prefix, key)
    finally:
        await client.aclose()


async def test_a_call_holding_its_turn_also_waits_out_a_later_429_of_its_key(scripted):
    s = scripted("key-3")
    scope = CallScope(run_id="r2", scope="lead", emit=None, suspendable=True)
    token = current_scope.set(scope)
    try:
        await s.use_up()
        with pytest.raises(RateLimitWait) as first:
            await s.client.create_message(request())
        assert first.value.wait.limit == "requests_per_minute"
        # meanwhile the provider refuses another worker's call: the key is held for 30 s
        await s.limiter.feed("m", "key-3", blocked_seconds=30)
        with pytest.raises(RateLimitWait) as again:  # the same call's next attempt
            await s.client.create_message(request())
        assert again.value.wait.limit == "retry_after"
        assert again.value.wait.resume_at_ms > first.value.wait.resume_at_ms
        with pytest.raises(RateLimitWait) as third:  # once more: the block moved the turn once
            await s.client.create_message(request())
        assert third.value.wait.resume_at_ms == again.value.wait.resume_at_ms
        assert s.calls == []  # nothing was sent early
    finally:
        current_scope.reset(token)


async def test_a_step_whose_waiting_call_goes_after_all_is_no_longer_marked_waiting(scripted):
    s = scripted("key-4")
    noted: list[Any] = []
    scope = CallScope(run_id="r3", scope="lead", emit=None, suspendable=True, on_wait=noted.append)
    token = current_scope.set(scope)
    try:
        await s.use_up()
        with pytest.raises(RateLimitWait) as waited:  # e.g. a compaction's summary request
            await s.client.create_message(request())
        assert scope.wait is not None
        await asyncio.sleep(waited.value.wait.seconds)
        await s.client.create_message(request())  # the step's next call: its turn has come
        assert len(s.calls) == 1
        assert scope.wait is None and noted[-1] is None  # the step is not ended as waiting
    finally:
        current_scope.reset(token)
