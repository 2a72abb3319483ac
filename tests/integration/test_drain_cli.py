"""``lattice drain`` (``run_drain``) against the real Redis: members processed by hand
complete their work items, and the run's resume task lands on the lead queue."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import uuid

import pytest
import redis
from rich.console import Console

from lattice_client.runstore import RunStore
from lattice_mailbox.redis import RedisMailbox
from lattice_worker.errors import ConfigError
from lattice_worker.runtime.lead import segment as lead_segment
from lattice_worker.runtime.run.context import WorkerContext
from lattice_worker.runtime.worker.drain import run_drain
from lattice_worker.runtime.worker.registry import TeamRegistry
from tests.e2e.teams import plan
from tests.support.registry import publish_fake_worker
from tests.support.services import REDIS_URL, settings_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
def prefix(monkeypatch):
    name = f"test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("LATTICE_KEY_PREFIX", name)
    monkeypatch.setenv("LATTICE_BROKER_URL", REDIS_URL)
    monkeypatch.delenv("LATTICE_MAILBOX_URL", raising=False)
    yield name
    sync = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(sync.scan_iter(match=f"{name}:*", count=1000))
        if keys:
            sync.delete(*keys)
    finally:
        sync.close()


async def suspended_run(prefix: str, prompt: str) -> tuple[str, list]:
    """Start a run's lead in-process; returns the run id and the doorbells it rang (not sent)."""
    mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
    registry = TeamRegistry(mailbox)
    registry.load("tests.e2e.teams:team")
    runs = RunStore(REDIS_URL, prefix)
    rung: list = []
    ctx = WorkerContext(
        settings=settings_for(prefix),
        registry=registry,
        mailbox=mailbox,
        runs=runs,
        send_task=lambda *a: rung.append(a),
    )
    run_id = f"run_{uuid.uuid4().hex[:8]}"
    await runs.create(run_id, "e2e", prompt)
    assert await lead_segment.run_lead(ctx, run_id) == "suspended"
    await runs.aclose()
    await mailbox.aclose()
    return run_id, rung


def queued_tasks(prefix: str, queue: str) -> list[tuple[str, list]]:
    sync = redis.Redis.from_url(REDIS_URL)
    try:
        raw = sync.lrange(f"{prefix}:{queue}", 0, -1)
    finally:
        sync.close()
    out = []
    for item in raw:
        message = json.loads(item)
        headers = message["headers"]
        out.append((headers["task"], json.loads(base64.b64decode(message["body"]))[0]))
    return out


async def test_drain_processes_members_and_the_run_resumes_on_the_lead_queue(prefix):
    run_id, rung = await suspended_run(prefix, plan(("worker", "handoff", "a"), ("other", "handoff", "b")))
    assert len(rung) == 2  # doorbells that no worker will answer
    out = io.StringIO()
    result = await asyncio.to_thread(
        run_drain, "tests.e2e.teams:team", [], 5, 10, Console(file=out, width=120)
    )
    assert (result.processed, result.failed, result.rounds) == (2, 0, 1)
    assert "drained 2 message(s), 0 failed" in out.getvalue()
    assert queued_tasks(prefix, f"{prefix}.e2e.lead") == [("lattice.resume_lead", [run_id])]
    runs = RunStore(REDIS_URL, prefix)
    try:
        assert (await runs.get(run_id)).status.value == "resuming"
    finally:
        await runs.aclose()


async def test_drain_honours_member_filter_and_limits(prefix):
    run_id, _ = await suspended_run(
        prefix, plan(("worker", "handoff", "w1"), ("worker", "handoff", "w2"), ("other", "handoff", "o1"))
    )
    console = Console(file=io.StringIO())
    first = await asyncio.to_thread(run_drain, "tests.e2e.teams:team", ["worker"], 5, 1, console)
    assert (first.processed, first.rounds) == (1, 1)
    second = await asyncio.to_thread(run_drain, "tests.e2e.teams:team", ["worker"], 5, 10, console)
    assert (second.processed, second.rounds) == (1, 1)  # only worker's second message; other untouched
    mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
    try:
        assert [m.status.value for m in await mailbox.inbox("e2e::other", "all")] == ["pending"]
    finally:
        await mailbox.aclose()
    assert queued_tasks(prefix, f"{prefix}.e2e.lead") == []  # the run still waits for "other"


def test_drain_rejects_bad_input(prefix):
    console = Console(file=io.StringIO())
    with pytest.raises(ConfigError, match="unknown member"):
        run_drain("tests.e2e.teams:team", ["nobody"], 1, 1, console)
    with pytest.raises(ConfigError, match="max_rounds"):
        run_drain("tests.e2e.teams:team", [], 0, 1, console)
    with pytest.raises(ConfigError, match="cannot import"):
        run_drain("no_such_module_q:team", [], 1, 1, console)


def publish(prefix: str, mapping: dict[str, str]) -> None:
    """What a live ``lattice worker`` publishes in the registry."""
    publish_fake_worker(prefix, mapping)


async def test_drain_by_a_name_only_a_running_worker_registered(prefix):
    run_id, _ = await suspended_run(prefix, plan(("worker", "handoff", "n1")))
    console = Console(file=io.StringIO())
    with pytest.raises(ConfigError, match=r"published teams: \(none\)"):
        run_drain("e2e", [], 5, 10, console)  # nothing registered here, no worker yet
    publish(prefix, {"tests.e2e.teams:team": "e2e", "e2e": "e2e"})
    result = await asyncio.to_thread(run_drain, "e2e", [], 5, 10, console)
    assert (result.processed, result.failed) == (1, 0)
    assert queued_tasks(prefix, f"{prefix}.e2e.lead") == [("lattice.resume_lead", [run_id])]
    with pytest.raises(ConfigError, match=r"unknown team 'nosuch'.*published teams: e2e"):
        run_drain("nosuch", [], 1, 1, console)


def test_a_published_nested_team_name_drains_that_team_only(prefix):
    from lattice_mailbox.memory import MemoryMailbox
    from lattice_worker.runtime.worker.drain import _targets, load_root

    publish(
        prefix,
        {
            "tests.e2e.teams:team": "e2e",
            "tests.e2e.teams:nested_team": "e2e_company",
            "e2e": "e2e",
            "e2e_company": "e2e_company",
            "e2e_eng": "e2e_eng",
        },
    )
    registry = TeamRegistry(MemoryMailbox())
    root = load_root(registry, "e2e_eng", REDIS_URL, prefix)
    assert root.name == "e2e_eng"
    assert [t.mailbox_id for t in _targets(registry, root, [])] == ["e2e_eng::backend"]
    company = load_root(TeamRegistry(MemoryMailbox()), "e2e_company", REDIS_URL, prefix)
    assert company.name == "e2e_company"
