"""LatticeClient / AsyncLatticeClient against the real Redis on 127.0.0.1:6379.

No worker runs here: the tests look at what the client writes (run records,
the raw Celery message on the queue's Redis list) and play the worker's part
through the RunStore (appending events, finishing runs). Every test uses its
own ``test-<uuid>`` key prefix and deletes every key under it afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import threading
import time
import uuid

import pytest
import redis

from lattice_client import (
    AsyncLatticeClient,
    LatticeClient,
    RunNotFoundError,
    RunResult,
    RunStatus,
    RunStore,
)
from lattice_mailbox import RedisMailbox
from tests.support.registry import publish_fake_worker
from tests.support.services import REDIS_URL, settings_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _cleanup(*prefixes: str) -> None:
    sync = redis.Redis.from_url(REDIS_URL)
    try:
        for p in prefixes:
            keys = list(sync.scan_iter(match=f"{p}:*", count=1000))
            if keys:
                sync.delete(*keys)
    finally:
        sync.close()


REGISTERED = ("example", "other")


def register_teams(prefix: str, *names: str, refs: dict[str, str] | None = None) -> None:
    """Write a live-registry entry as a running worker serving ``names`` (and ``refs``) does."""
    teams = {name: name for name in names} | (refs or {})
    publish_fake_worker(prefix, teams, node=f"fake-{'-'.join(sorted(teams))}@test")


def written(raw: redis.Redis, prefix: str) -> list[str]:
    """Every key under ``prefix`` but the live worker registry's."""
    registry = (f"{prefix}:workers", f"{prefix}:worker:")
    return sorted(k for k in raw.scan_iter(match=f"{prefix}:*") if not k.startswith(registry))


@pytest.fixture
def prefix():
    """A fresh key prefix whose workers have registered the teams ``example`` and ``other``."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    register_teams(name, *REGISTERED)
    yield name
    _cleanup(name)


TEAM_MODULE = """
import os
from pathlib import Path

Path(os.environ["LATTICE_TEST_IMPORT_MARKER"]).write_text("imported")

from lattice_worker import ScriptedModelClient, define_agent, text_turn
from lattice_worker.team import create_team, team_member


def build():
    lead = define_agent(name="lead", model_client=ScriptedModelClient([text_turn("ok")]))
    helper = define_agent(name="helper", model_client=ScriptedModelClient([text_turn("ok")]))
    return create_team(name="beta", lead=lead, members=[team_member(name="helper", agent=helper)])


team = build()


class _NotATeam:
    name = "gamma"


not_a_team = _NotATeam()
"""


@pytest.fixture
def client(prefix):
    c = LatticeClient(REDIS_URL, key_prefix=prefix)
    yield c
    c.close()


def play_worker(prefix: str, coro_fn, delay: float = 0.3) -> threading.Thread:
    """Run ``coro_fn(store)`` on its own loop in a thread after ``delay`` seconds
    (the test's stand-in for a worker writing to the run store)."""

    def main() -> None:
        time.sleep(delay)

        async def go() -> None:
            store = RunStore(REDIS_URL, prefix=prefix)
            try:
                await coro_fn(store)
            finally:
                await store.aclose()

        asyncio.run(go())

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    return thread


def queue_messages(raw: redis.Redis, prefix: str, queue: str) -> list[dict]:
    return [json.loads(m) for m in raw.lrange(f"{prefix}:{queue}", 0, -1)]


# -- submit ----------------------------------------------------------------------------------------


def test_submit_writes_the_run_and_exactly_one_json_run_lead_message(client, raw, prefix):
    handle = client.submit("example", "Look for the word lease", metadata={"ticket": 42})
    assert handle.run_id.startswith("run_")
    record = client.get_run(handle.run_id)
    assert record.status is RunStatus.QUEUED
    assert (record.team, record.team_ref, record.prompt, record.metadata) == (
        "example",
        None,
        "Look for the word lease",
        {"ticket": 42},
    )
    # the raw Redis list of queue <prefix>.example.lead, under the key prefix
    lists = sorted(k for k in raw.scan_iter(match=f"{prefix}:*") if raw.type(k) == "list")
    assert lists == [f"{prefix}:{prefix}.example.lead"]
    [message] = queue_messages(raw, prefix, f"{prefix}.example.lead")
    assert message["content-type"] == "application/json"
    assert message["content-encoding"] == "utf-8"
    assert message["headers"]["task"] == "lattice.run_lead"
    assert message["headers"]["id"] == f"{handle.run_id}.run_lead"
    assert message["properties"]["delivery_info"]["routing_key"] == f"{prefix}.example.lead"
    body = json.loads(base64.b64decode(message["body"]))
    assert body[0] == [handle.run_id] and body[1] == {}


def test_submit_resolves_refs_through_the_worker_registry(client, raw, prefix):
    register_teams(prefix, "alpha", refs={"lattice_worker.examples.team:team": "alpha"})
    handle = client.submit("lattice_worker.examples.team:team", "hi", run_id="my-run-1")
    assert handle.run_id == "my-run-1"
    record = client.get_run("my-run-1")
    assert (record.team, record.team_ref) == ("alpha", "lattice_worker.examples.team:team")
    assert len(queue_messages(raw, prefix, f"{prefix}.alpha.lead")) == 1
    client.submit("alpha", "by name", run_id="my-run-2")
    assert client.get_run("my-run-2").team_ref is None
    assert len(queue_messages(raw, prefix, f"{prefix}.alpha.lead")) == 2


def test_an_unregistered_ref_is_refused_and_never_imported(client, raw, prefix, tmp_path, monkeypatch):
    module = f"lattice_test_team_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(TEAM_MODULE)
    marker = tmp_path / "imported.marker"
    monkeypatch.setenv("LATTICE_TEST_IMPORT_MARKER", str(marker))
    monkeypatch.syspath_prepend(str(tmp_path))
    for allow in (False, True):
        with pytest.raises(ValueError, match=rf"unknown team reference '{module}:team'.*never imports"):
            client.submit(f"{module}:team", "hi", require_registered=not allow)
    with pytest.raises(ValueError, match="unknown team reference"):
        client.status(f"{module}:team")
    assert written(raw, prefix) == []  # no run record, no task
    assert not marker.exists() and module not in sys.modules  # the module was never imported
    # once a live worker publishes the reference, it resolves by the name that worker gave
    register_teams(prefix, "beta", refs={f"{module}:team": "beta"})
    record = client.get_run(client.submit(f"{module}:team", "hi").run_id)
    assert (record.team, record.team_ref) == ("beta", f"{module}:team")
    assert not marker.exists() and module not in sys.modules


@pytest.mark.parametrize(
    ("team", "match"),
    [
        ("nosuchteam", r"no live worker serves team 'nosuchteam'.*serving: example, other"),
        (
            "lattice_worker.examples.team",
            r"no live worker serves team 'lattice_worker.examples.team'.*needs ':attribute', e.g. 'lattice_worker.examples.team:team'",
        ),
        (
            "lattice_worker.examples.team:TEAM_NAME",
            r"unknown team reference 'lattice_worker.examples.team:TEAM_NAME'",
        ),
        ("x" * 65, "invalid team name"),
        ("bad/name", "invalid team name"),
        ("pkg.mod:" + "a" * 200, "at most 200 characters"),
        ("pkg mod:team", "invalid team reference"),
    ],
)
def test_a_team_no_live_worker_serves_or_malformed_is_refused(client, raw, prefix, team, match):
    with pytest.raises(ValueError, match=match) as refused:
        client.submit(team, "hi")
    assert written(raw, prefix) == []  # no run record, no index, no queue: no task sent
    if "no live worker" in str(refused.value):
        assert "require_registered=False" in str(refused.value) and "--allow-unregistered" in str(
            refused.value
        )


def test_require_registered_false_queues_a_name_before_its_workers_start(client, raw, prefix, caplog):
    with pytest.raises(ValueError, match="no live worker serves team 'latecomer'"):
        client.submit("latecomer", "hi")
    with caplog.at_level("WARNING", logger="lattice_client"):
        handle = client.submit("latecomer", "early", require_registered=False)
    assert "no live worker serves team 'latecomer'" in caplog.text and "queued" in caplog.text
    record = client.get_run(handle.run_id)
    assert (record.team, record.team_ref, record.status) == ("latecomer", None, RunStatus.QUEUED)
    assert len(queue_messages(raw, prefix, f"{prefix}.latecomer.lead")) == 1
    # malformed names stay refused
    with pytest.raises(ValueError, match="invalid team name"):
        client.submit("has space", "hi", require_registered=False)
    # once a worker registered the team, the default submit takes it
    register_teams(prefix, "latecomer")
    client.submit("latecomer", "later")
    assert len(queue_messages(raw, prefix, f"{prefix}.latecomer.lead")) == 2


def test_a_team_whose_lead_queue_no_live_worker_consumes_is_not_served(client, raw, prefix, caplog):
    # a live worker serves the team's member only (or consumes none of its queues)
    publish_fake_worker(
        prefix,
        {"half": "half", "pkg.half:team": "half"},
        node="member-only@test",
        queues=[f"{prefix}.half.scout"],
    )
    for team in ("half", "pkg.half:team"):
        with pytest.raises(ValueError, match=r"none consumes its lead queue '.*\.half\.lead'") as refused:
            client.submit(team, "hi")
        assert "--member lead" in str(refused.value) and "require_registered=False" in str(refused.value)
    assert written(raw, prefix) == []
    # queued when the caller says so, by name or by the reference a live worker published
    with caplog.at_level("WARNING", logger="lattice_client"):
        by_ref = client.submit("pkg.half:team", "early", require_registered=False)
    assert "consuming its lead queue" in caplog.text
    record = client.get_run(by_ref.run_id)
    assert (record.team, record.team_ref, record.status) == ("half", "pkg.half:team", RunStatus.QUEUED)
    assert len(queue_messages(raw, prefix, f"{prefix}.half.lead")) == 1
    # a worker that consumes the lead queue serves it, under any reference a live worker
    # published for it (here the members-only worker's: the lead's was started with another)
    publish_fake_worker(prefix, {"half": "half", "pkg.new:team": "half"}, node="lead@test")
    client.submit("half", "now")
    record = client.get_run(client.submit("pkg.half:team", "by the old reference").run_id)
    assert (record.team, record.team_ref) == ("half", "pkg.half:team")
    assert len(queue_messages(raw, prefix, f"{prefix}.half.lead")) == 3


def test_a_worker_whose_entry_expired_serves_nothing(client, raw, prefix):
    publish_fake_worker(prefix, {"brief": "brief"}, node="short-lived@test", ttl_seconds=0.3)
    client.submit("brief", "while it lives")
    time.sleep(0.5)
    client.aio._teams.clear()  # past the client's short cache of live answers
    with pytest.raises(ValueError, match="no live worker serves team 'brief'"):
        client.submit("brief", "after it expired")
    assert "short-lived@test" not in raw.smembers(f"{prefix}:workers")  # the reader dropped it


@pytest.mark.parametrize("run_id", ["child.m_123", "child.", "a" * 129, "bad id", "é"])
def test_reserved_or_malformed_run_ids_are_refused(client, raw, prefix, run_id):
    with pytest.raises(ValueError, match="invalid run id"):
        client.submit("example", "hi", run_id=run_id)
    assert written(raw, prefix) == []


async def test_async_client_refuses_unregistered_names_too(prefix, raw):
    async with AsyncLatticeClient(REDIS_URL, key_prefix=prefix) as c:
        with pytest.raises(ValueError, match="no live worker serves team 'nosuchteam'"):
            await c.submit("nosuchteam", "hi")
        handle = await c.submit("nosuchteam", "hi", require_registered=False)
        assert (await handle.get()).team == "nosuchteam"
        assert await c.registered_teams() == {"example": "example", "other": "other"}


@pytest.mark.parametrize(
    ("team", "prompt", "kwargs", "match"),
    [
        ("no_such_module_xyz:team", "hi", {}, "unknown team reference"),
        ("example", "", {}, "prompt"),
        ("example", "   ", {}, "prompt"),
        ("has space", "hi", {}, "invalid team name"),
        ("", "hi", {}, "team"),
        ("example", "hi", {"run_id": "bad id"}, "invalid run id"),
        ("example", "hi", {"metadata": {"x": object()}}, "metadata"),
        ("example", "hi", {"metadata": [1]}, "metadata must be a dict"),
        ("example", "half a pair \ud800", {}, "prompt is not valid Unicode text"),
        ("example", "hi", {"metadata": {"note": "\udfff"}}, "metadata is not valid Unicode text"),
        ("example", "hi", {"trace_parent": "00-not-a-traceparent"}, "is not a W3C traceparent"),
        ("example", "hi", {"trace_parent": {"traceparent": 7}}, "trace_parent must map header names"),
    ],
)
def test_bad_submit_input_writes_nothing(client, raw, prefix, team, prompt, kwargs, match):
    with pytest.raises(ValueError, match=match):
        client.submit(team, prompt, **kwargs)
    assert written(raw, prefix) == []


def test_prompt_over_the_size_bound_is_refused(prefix, raw):
    settings = settings_for(prefix, max_message_bytes=64)
    with LatticeClient(settings=settings) as c:
        with pytest.raises(ValueError, match="over the bound of 64 bytes"):
            c.submit("example", "é" * 40)  # 80 bytes in UTF-8
        with pytest.raises(ValueError, match="metadata is 72 bytes as JSON, over the bound of 64 bytes"):
            c.submit("example", "hi", metadata={"notes": "x" * 60})
        c.submit("example", "hi", metadata={"notes": "x" * 50})  # 62 bytes: taken
    assert [k for k in written(raw, prefix) if ":run:" in k]  # only that one run was written


def test_submit_keeps_the_callers_trace_context_on_the_run(client):
    traceparent = f"00-{'ab' * 16}-{'cd' * 8}-01"
    handle = client.submit("example", "hi", metadata={"ticket": 1}, trace_parent=traceparent)
    assert client.get_run(handle.run_id).metadata == {
        "ticket": 1,
        "lattice_caller": {"trace_carrier": {"traceparent": traceparent}},
    }


def test_duplicate_run_id_is_refused_without_a_second_task(client, raw, prefix):
    client.submit("example", "first", run_id="dup")
    with pytest.raises(ValueError, match="already exists"):
        client.submit("example", "second", run_id="dup")
    assert client.get_run("dup").prompt == "first"
    assert len(queue_messages(raw, prefix, f"{prefix}.example.lead")) == 1


def test_redis_down_raises_a_connection_error():
    with LatticeClient("redis://127.0.0.1:1/0", key_prefix="test-down") as c:
        with pytest.raises(redis.exceptions.ConnectionError):
            c.submit("example", "hi")
        with pytest.raises(redis.exceptions.ConnectionError):
            c.get_run("x")


# -- wait / events ---------------------------------------------------------------------------------


def test_wait_returns_when_the_result_event_is_appended(client, prefix):
    handle = client.submit("example", "hi")
    expected = RunResult(run_id=handle.run_id, status="completed", result="42", usage={"output_tokens": 5})

    async def finish(store: RunStore) -> None:
        await store.set_status(handle.run_id, "running")
        await store.append_event(handle.run_id, {"type": "assistant", "text": "thinking"})
        await store.finish(handle.run_id, expected)

    worker = play_worker(prefix, finish, delay=0.3)
    assert handle.wait(timeout=20) == expected
    worker.join(5)
    # waiting again (run already finished) returns at once
    assert client.wait(handle.run_id, timeout=0) == expected


def test_wait_timeout_raises_the_builtin_timeout_error(client):
    handle = client.submit("example", "hi")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 0.3 s"):
        handle.wait(timeout=0.3)
    assert time.monotonic() - started < 10  # it did return (no hang); no timing threshold tighter than that
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0)
    assert client.get_run(handle.run_id).status is RunStatus.QUEUED  # waiting changes nothing


def test_wait_on_an_unknown_run(client):
    with pytest.raises(RunNotFoundError, match="'nope' not found"):
        client.wait("nope", timeout=1)
    with pytest.raises(ValueError, match="invalid run id"):
        client.handle("bad id")


def test_events_yield_every_event_in_order_and_end_after_run_result(client, prefix):
    handle = client.submit("example", "hi")

    async def play(store: RunStore) -> None:
        for n in range(3):
            await store.append_event(handle.run_id, {"type": "team_message", "n": n})
            await asyncio.sleep(0.05)
        await store.finish(handle.run_id, RunResult(run_id=handle.run_id, status="failed", error="boom"))
        await store.append_event(handle.run_id, {"type": "after-the-end"})

    worker = play_worker(prefix, play, delay=0.2)
    events = list(handle.events(timeout=20))
    worker.join(5)
    assert [e["type"] for e in events] == ["team_message"] * 3 + ["run_result"]
    assert [e["n"] for e in events[:3]] == [0, 1, 2]
    assert events[-1]["status"] == "failed" and events[-1]["error"] == "boom"
    assert handle.wait(timeout=1).error == "boom"


def test_events_timeout_raises_after_the_events_so_far(client, prefix):
    handle = client.submit("example", "hi")
    asyncio.run(_append(prefix, handle.run_id, {"type": "progress"}))
    seen = []
    with pytest.raises(TimeoutError):
        for event in handle.events(timeout=0.5):
            seen.append(event)
    assert seen == [{"type": "progress"}]


async def _append(prefix: str, run_id: str, event: dict) -> None:
    store = RunStore(REDIS_URL, prefix=prefix)
    try:
        await store.append_event(run_id, event)
    finally:
        await store.aclose()


def test_wait_uses_the_record_when_the_stream_is_gone(client, raw, prefix):
    handle = client.submit("example", "hi")
    result = RunResult(run_id=handle.run_id, status="completed", result="kept")

    async def finish(store: RunStore) -> None:
        await store.finish(handle.run_id, result)

    play_worker(prefix, finish, delay=0).join(10)
    raw.delete(f"{prefix}:run:{{run:{handle.run_id}}}:events")
    assert handle.wait(timeout=1) == result


# -- cancel / status / inbox -----------------------------------------------------------------------


def test_cancel_with_no_worker_online_cancels_pending_mailbox_messages(client, prefix, raw):
    handle = client.submit("example", "hi")

    async def delegate(store: RunStore) -> list[str]:
        mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
        try:
            ids = []
            for n, member in enumerate(["searcher", "counter", "searcher"]):
                m = await mailbox.send(
                    "example::lead", f"example::{member}", f"task {n}", work_item_id=f"wi-{n}"
                )
                ids.append(m.id)
            await store.set_status(handle.run_id, "running")
            items = [
                {
                    "work_item_id": f"wi-{n}",
                    "message_id": ids[n],
                    "mailbox_id": f"example::{m}",
                    "member": m,
                    "mode": "handoff",
                    "tool_use_id": f"t{n}",
                }
                for n, m in enumerate(["searcher", "counter", "searcher"])
            ]
            await store.add_items(handle.run_id, items, max_active=2)
            # the first item was already done before the cancel
            claimed = await mailbox.claim_next("example::searcher")
            assert claimed is not None and claimed.id == ids[0]
            await mailbox.update_status(ids[0], "done")
            await store.complete_item(handle.run_id, "wi-0", {"status": "done"})
            await store.suspend(handle.run_id)
            return ids
        finally:
            await mailbox.aclose()

    ids: list[str] = []

    async def run(store: RunStore) -> None:
        ids.extend(await delegate(store))

    play_worker(prefix, run, delay=0).join(10)
    report = client.cancel(handle.run_id)
    assert report.status is RunStatus.CANCELLED
    assert sorted(report.cancelled_messages) == sorted(ids[1:])
    assert report.skipped_messages == {}
    # the mailbox shows them cancelled; nothing is left pending for a worker to pick up later
    assert [m.id for m in client.inbox("example::searcher", "cancelled")] == [ids[2]]
    assert [m.id for m in client.inbox("example::counter", "cancelled")] == [ids[1]]
    assert client.inbox("example::searcher") == [] and client.inbox("example::counter") == []
    assert [m.id for m in client.inbox("example::searcher", "done")] == [ids[0]]
    result = handle.wait(timeout=1)
    assert result.status == "cancelled"
    # cancelling again changes nothing
    again = client.cancel(handle.run_id)
    assert again.cancelled_messages == []
    assert again.skipped_messages == {ids[1]: "already cancelled", ids[2]: "already cancelled"}
    assert len([e for e in handle.events(timeout=1)]) == 1


def test_cancel_of_a_finished_run_changes_nothing(client, prefix):
    handle = client.submit("example", "hi")

    async def finish(store: RunStore) -> None:
        await store.finish(handle.run_id, RunResult(run_id=handle.run_id, status="completed", result="ok"))

    play_worker(prefix, finish, delay=0).join(10)
    report = client.cancel(handle.run_id)
    assert report.status is RunStatus.COMPLETED and report.cancelled_messages == []
    assert handle.wait(timeout=1).result == "ok"
    with pytest.raises(RunNotFoundError):
        client.cancel("missing")


def test_status_counts_team_mailboxes_and_lists_recent_runs(client, prefix):
    async def fill() -> None:
        mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
        try:
            await mailbox.send("example::lead", "example::searcher", "a")
            await mailbox.send("example::lead", "example::searcher", "b")
            await mailbox.send("example::lead", "example::counter", "c")
            await mailbox.send("other::lead", "other::worker", "d")
            claimed = await mailbox.claim_next("example::searcher")
            assert claimed is not None
        finally:
            await mailbox.aclose()

    asyncio.run(fill())
    first = client.submit("example", "one")
    second = client.submit("example", "two")
    client.submit("other", "three")
    report = client.status("example")
    assert set(report.mailboxes) == {"example::searcher", "example::counter"}
    assert report.mailboxes["example::searcher"]["pending"] == 1
    assert report.mailboxes["example::searcher"]["processing"] == 1
    assert report.mailboxes["example::counter"]["pending"] == 1
    assert [r.run_id for r in report.runs] == [second.run_id, first.run_id]
    register_teams(prefix, refs={"lattice_worker.examples.team:team": "example"})
    assert set(client.status("lattice_worker.examples.team:team").mailboxes) == {
        "example::searcher",
        "example::counter",
    }
    everything = client.status()
    assert set(everything.mailboxes) == {"example::searcher", "example::counter", "other::worker"}
    assert len(everything.runs) == 3


def test_inbox_lists_messages_and_refuses_unknown_status(client, prefix):
    async def fill() -> None:
        mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
        try:
            await mailbox.send("example::lead", "example::searcher", "first")
            await mailbox.send("example::lead", "example::searcher", "second")
        finally:
            await mailbox.aclose()

    asyncio.run(fill())
    assert [m.content for m in client.inbox("example::searcher")] == ["first", "second"]
    assert [m.content for m in client.inbox("example::searcher", "all")] == ["first", "second"]
    assert client.inbox("example::searcher", "done") == []
    with pytest.raises(ValueError, match="unknown message status"):
        client.inbox("example::searcher", "bogus")


# -- deployments, async API, loops -----------------------------------------------------------------


def test_a_second_deployment_prefix_sees_nothing(client, prefix, raw):
    other = f"{prefix}-other"
    register_teams(other, "example")
    handle = client.submit("example", "hi")
    try:
        with LatticeClient(REDIS_URL, key_prefix=other) as b:
            assert b.get_run(handle.run_id) is None
            report = b.status()
            assert report.runs == [] and report.mailboxes == {}
            with pytest.raises(RunNotFoundError):
                b.wait(handle.run_id, timeout=0)
            with pytest.raises(RunNotFoundError):
                b.cancel(handle.run_id)
            b.submit("example", "theirs")
        # each deployment's queue holds only its own task
        [mine] = queue_messages(raw, prefix, f"{prefix}.example.lead")
        [theirs] = queue_messages(raw, other, f"{other}.example.lead")
        assert json.loads(base64.b64decode(mine["body"]))[0] == [handle.run_id]
        assert json.loads(base64.b64decode(theirs["body"]))[0] != [handle.run_id]
        assert client.get_run(handle.run_id).status is RunStatus.QUEUED
    finally:
        _cleanup(other)


async def test_async_client_same_api(prefix, raw):
    async with AsyncLatticeClient(REDIS_URL, key_prefix=prefix) as c:
        handle = await c.submit("example", "hi", metadata={"a": 1})
        assert (await handle.get()).metadata == {"a": 1}
        assert len(queue_messages(raw, prefix, f"{prefix}.example.lead")) == 1
        with pytest.raises(TimeoutError):
            await handle.wait(timeout=0.2)
        store = RunStore(REDIS_URL, prefix=prefix)
        try:
            await store.append_event(handle.run_id, {"type": "step"})

            async def finish_later() -> None:
                await asyncio.sleep(0.2)
                await store.finish(
                    handle.run_id, RunResult(run_id=handle.run_id, status="completed", result="ok")
                )

            finisher = asyncio.create_task(finish_later())
            events = [e async for e in handle.events(timeout=10)]
            await finisher
        finally:
            await store.aclose()
        assert [e["type"] for e in events] == ["step", "run_result"]
        assert (await handle.wait(timeout=1)).result == "ok"
        assert (await c.cancel(handle.run_id)).status is RunStatus.COMPLETED


async def test_the_blocking_client_works_inside_a_running_event_loop(prefix):
    """The sync client runs on its own loop thread, so calling it from async code
    (as in Jupyter) does not hit 'event loop is already running'."""
    with LatticeClient(REDIS_URL, key_prefix=prefix) as c:
        handle = c.submit("example", "hi")
        assert c.get_run(handle.run_id).status is RunStatus.QUEUED
        with pytest.raises(TimeoutError):
            handle.wait(timeout=0.1)


def test_close_is_idempotent_and_calls_after_close_fail_clearly(prefix):
    c = LatticeClient(REDIS_URL, key_prefix=prefix)
    c.submit("example", "hi")
    c.close()
    c.close()
    with pytest.raises(RuntimeError, match="closed"):
        c.get_run("x")


def test_importing_lattice_client_never_imports_the_worker_side():
    code = (
        "import sys, lattice_client, lattice_client.client, lattice_client.cli, lattice_client.runstore\n"
        "from lattice_client import LatticeClient\n"
        f"LatticeClient({REDIS_URL!r}, key_prefix='test-import').close()\n"
        "print('lattice_worker' in sys.modules, any(m.startswith('lattice_worker.') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]
