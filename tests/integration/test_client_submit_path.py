"""The client's submit path against the real Redis: the team registry answer
kept by the client (registered answers only), and a run_lead task that cannot be
sent failing its run, for the blocking client (which sends from the calling
thread) and the async one. No worker runs; each test has its own key prefix.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import uuid

import kombu
import pytest
import redis

from lattice_client import AsyncLatticeClient, LatticeClient, RunStatus, RunStore
from tests.support.registry import publish_fake_worker
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def lead_queue(raw, prefix: str, team: str) -> list[str]:
    return raw.lrange(f"{prefix}:{prefix}.{team}.lead", 0, -1)


def test_a_registered_team_is_resolved_once_and_unregistered_answers_are_not_kept(prefix, raw):
    publish_fake_worker(prefix, {"example": "example", "pkg.mod:team": "example"})
    with LatticeClient(REDIS_URL, key_prefix=prefix) as client:
        client.submit("example", "one")
        client.submit("pkg.mod:team", "two")
        raw.delete(
            f"{prefix}:workers", f"{prefix}:worker:fake-worker@test"
        )  # the answer was kept: no lookup now
        third = client.submit("example", "three")
        fourth = client.submit("pkg.mod:team", "four")
        assert client.get_run(fourth.run_id).team_ref == "pkg.mod:team"
        assert client.get_run(third.run_id).team == "example"
        assert len(lead_queue(raw, prefix, "example")) == 4
        # a refusal is not kept: once a worker registers the name it is accepted
        with pytest.raises(ValueError, match="no live worker serves team 'late'"):
            client.submit("late", "hi")
        publish_fake_worker(prefix, {"late": "late"}, node="late@test")
        assert client.get_run(client.submit("late", "hi").run_id).team == "late"


def test_blocking_submit_sends_from_the_calling_thread_and_a_failed_send_fails_the_run(
    prefix, raw, monkeypatch
):
    publish_fake_worker(prefix, {"example": "example"})
    with LatticeClient(REDIS_URL, key_prefix=prefix) as client:
        senders: list[threading.Thread] = []
        original = client.aio._send_run_lead

        def send(run_id: str, queue: str) -> None:
            senders.append(threading.current_thread())
            original(run_id, queue)

        monkeypatch.setattr(client.aio, "_send_run_lead", send)
        handle = client.submit("example", "hi")
        assert senders == [threading.current_thread()]
        assert client.get_run(handle.run_id).status is RunStatus.QUEUED
        assert len(lead_queue(raw, prefix, "example")) == 1

        def broken(run_id: str, queue: str) -> None:
            raise ConnectionError("broker down")

        monkeypatch.setattr(client.aio, "_send_run_lead", broken)
        with pytest.raises(ConnectionError, match="broker down"):
            client.submit("example", "hi", run_id="r-broken")
        result = client.wait("r-broken", timeout=5)
        assert result.status == "failed" and "broker down" in (result.error or "")
        assert "could not enqueue lattice.run_lead" in (result.error or "")
        assert len(lead_queue(raw, prefix, "example")) == 1


async def test_async_submit_with_a_failed_send_fails_the_run(prefix, raw, monkeypatch):
    publish_fake_worker(prefix, {"example": "example"})
    async with AsyncLatticeClient(REDIS_URL, key_prefix=prefix) as client:

        def broken(run_id: str, queue: str) -> None:
            raise ConnectionError("broker down")

        monkeypatch.setattr(client, "_send_run_lead", broken)
        with pytest.raises(ConnectionError, match="broker down"):
            await client.submit("example", "hi", run_id="r-broken")
        result = await client.wait("r-broken", timeout=5)
        assert result.status == "failed" and "broker down" in (result.error or "")


def test_submit_publishes_the_task_and_its_task_sent_event(prefix, raw):
    publish_fake_worker(prefix, {"example": "example"})
    pubsub = raw.pubsub()
    pubsub.psubscribe(f"{prefix}:*celeryev/task.sent")
    try:
        assert pubsub.get_message(timeout=5)["type"] == "psubscribe"
        with LatticeClient(REDIS_URL, key_prefix=prefix) as client:
            handle = client.submit("example", "hi")
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["type"] == "pmessage"
        envelope = json.loads(message["data"])
        event = json.loads(base64.b64decode(envelope["body"]))
        assert event["type"] == "task-sent" and event["uuid"] == f"{handle.run_id}.run_lead"
        assert event["name"] == "lattice.run_lead" and event["queue"] == f"{prefix}.example.lead"
    finally:
        pubsub.close()
    (task,) = [json.loads(m) for m in lead_queue(raw, prefix, "example")]
    assert task["headers"]["id"] == f"{handle.run_id}.run_lead"
    assert json.loads(base64.b64decode(task["body"]))[0] == [handle.run_id]


class _BrokenBatch:
    def __enter__(self) -> _BrokenBatch:
        raise ConnectionError("pipeline broke")

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_failed_publish_batch_is_sent_again_the_plain_way(prefix, raw, monkeypatch):
    publish_fake_worker(prefix, {"example": "example"})
    monkeypatch.setattr(kombu.Producer, "batch", lambda self, *args, **kwargs: _BrokenBatch())
    with LatticeClient(REDIS_URL, key_prefix=prefix) as client:
        handle = client.submit("example", "hi")
        assert client.get_run(handle.run_id).status is RunStatus.QUEUED
    (task,) = [json.loads(m) for m in lead_queue(raw, prefix, "example")]
    assert task["headers"]["id"] == f"{handle.run_id}.run_lead"


def test_blocking_create_loads_an_unknown_script_and_refuses_a_duplicate(prefix, raw, monkeypatch):
    from lattice_client.runstore import scripts as runs_module

    # a create script the server has never seen (no SCRIPT FLUSH: the server is shared)
    source = runs_module.SCRIPTS["create"] + f"\n-- {uuid.uuid4().hex}\n"
    monkeypatch.setitem(runs_module.SCRIPTS, "create", source)
    monkeypatch.setitem(runs_module.SHAS, "create", hashlib.sha1(source.encode()).hexdigest())
    store = RunStore(REDIS_URL, prefix=prefix)
    sync = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        record = store.create_blocking(
            sync, "r1", "example", "hi", team_ref="pkg.mod:team", metadata={"k": 1}
        )
        assert record.status is RunStatus.QUEUED and record.metadata == {"k": 1}
        assert raw.hget(store.keys("r1").record, "team_ref") == "pkg.mod:team"
        assert raw.zscore(store.runs_index_key, "r1") == record.created_at
        assert raw.zscore(store.team_index_key("example"), "r1") == record.created_at
        raw.zrem(store.team_index_key("example"), "r1")
        with pytest.raises(ValueError, match="already exists"):
            store.create_blocking(sync, "r1", "example", "again")
        # a refused create takes back the index entry it added and changes nothing else
        assert raw.zscore(store.team_index_key("example"), "r1") is None
        assert raw.hget(store.keys("r1").record, "prompt") == "hi"
        with pytest.raises(ValueError, match="metadata must be a dict"):
            store.create_blocking(sync, "r2", "example", "hi", metadata=[1])  # type: ignore[arg-type]
        assert not raw.exists(store.keys("r2").record)
    finally:
        sync.close()
