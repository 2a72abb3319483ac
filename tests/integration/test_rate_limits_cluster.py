"""The shared model rate limits on a Redis Cluster (``LATTICE_MAILBOX_URL=redis+cluster://``),
against the session's cluster: a call's turn and the doorbell check read the
server's clock, which a cluster pipeline refuses (``TIME`` is blocked there), so
it is asked of the node of the bucket (newcomer walk-through: every limited call
failed with "Calling pipelined function time is blocked when running redis in
cluster mode")."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from lattice_client.model_limits import ModelLimit
from lattice_mailbox.connections import async_redis
from lattice_worker import AssistantModelMessage, ScriptedModelClient
from lattice_worker.agent.model import ModelRequest
from lattice_worker.runtime.limits.bucket import RateLimiter
from lattice_worker.runtime.limits.gate import CallScope, LimitedModelClient, RateLimitWait, current_scope
from lattice_worker.runtime.limits.hook import not_due

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def request() -> ModelRequest:
    return ModelRequest(model="m", system=None, messages=[{"role": "user", "content": "hi"}], max_tokens=16)


@pytest.fixture
async def cluster(redis_cluster):
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    client = async_redis(redis_cluster.url, decode_responses=True)
    try:
        yield client, prefix
    finally:
        await client.aclose()
        redis_cluster.delete_prefix(prefix)


async def test_limited_calls_take_their_turns_on_a_cluster(cluster):
    client, prefix = cluster

    async def redis() -> Any:
        return client

    sent: list[Any] = []

    def model(req: Any) -> Any:
        sent.append(req)
        return AssistantModelMessage(content=[{"type": "text", "text": "ok"}], stop_reason="end_turn")

    limiter = RateLimiter(redis, prefix, {"m": ModelLimit(requests_per_minute=2)})
    limited = LimitedModelClient(ScriptedModelClient(model), limiter, api_key="key-c")
    scope = CallScope(run_id="r1", scope="lead", emit=None, suspendable=True)
    token = current_scope.set(scope)
    try:
        for _ in range(2):  # the minute's two turns: sent at once
            await limited.create_message(request())
        assert len(sent) == 2
        with pytest.raises(RateLimitWait) as waited:  # the third waits for its turn, held for the scope
            await limited.create_message(request())
        assert waited.value.wait.limit == "requests_per_minute" and waited.value.wait.seconds > 1
        with pytest.raises(RateLimitWait) as again:  # its next attempt finds the kept turn
            await limited.create_message(request())
        assert again.value.wait.resume_at_ms == waited.value.wait.resume_at_ms
        assert len(sent) == 2  # nothing sent early
    finally:
        current_scope.reset(token)

    # a doorbell rung early leaves a member message whose call holds a later turn
    item_scope = CallScope(run_id="r2", scope="item:wi_1", emit=None, suspendable=True)
    token = current_scope.set(item_scope)
    try:
        with pytest.raises(RateLimitWait):
            await limited.create_message(request())
    finally:
        current_scope.reset(token)
    ctx = SimpleNamespace(settings=SimpleNamespace(model_limits={"m": ModelLimit(requests_per_minute=2)}))
    ctx.prefix, ctx.redis = prefix, redis
    messages = [
        SimpleNamespace(id="msg-held", work_item_id="wi_1", metadata={"run_id": "r2"}),
        SimpleNamespace(id="msg-free", work_item_id="wi_2", metadata={"run_id": "r2"}),
    ]
    assert await not_due(ctx, messages) == {"msg-held"}
