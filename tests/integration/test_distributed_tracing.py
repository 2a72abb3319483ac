"""A distributed run's trace: the carrier in the run record and in the task
messages, in-process against the real Redis.

The task bodies run in the test's event loop on two worker contexts, ``a`` and
``b``, standing for two worker processes: each has its own registry, whose
teams are traced by that "process's" own tracer (its own OpenTelemetry
provider and in-memory exporter). Only Redis -- the run record and the
mailbox messages -- connects them, as between real workers. The test decides
which context runs each enqueued task.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lattice_client.caller_trace import CALLER_KEY, with_caller_trace
from lattice_client.celery_config import RUN_LEAD_TASK
from lattice_client.errors import RunLeaseLostError
from lattice_worker import ScriptedModelClient, define_agent
from lattice_worker.runtime.run.trace import TRACE_CARRIER_KEY, run_tracer
from lattice_worker.team import create_team, team_member
from lattice_worker.tracing import create_jsonl_context_tracer, create_otel_context_tracer
from tests.e2e.teams import lead_model, member_model, plan, work
from tests.support.inprocess import Cluster, Worker

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


PLAN = plan(("worker", "handoff", "a"), ("other", "ask", "b"))


@pytest.fixture
def test_prefix(prefix, monkeypatch):
    monkeypatch.setenv("LATTICE_KEY_PREFIX", prefix)  # where the test team's work tool records
    return prefix


def otel() -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return create_otel_context_tracer(tracer_provider=tp), exporter


def lead(tracer: Any = None) -> Any:
    return define_agent(name="lead", model_client=ScriptedModelClient(lead_model), max_turns=8, tracer=tracer)


def member(name: str, tracer: Any = None) -> Any:
    """A template member running the test team's member model, with its own ``tracer``."""
    spec = define_agent(
        name=name, model_client=ScriptedModelClient(member_model), tools=[work], max_turns=8, tracer=tracer
    )
    return team_member(name=name, agent=spec)


def traced_team(tracer: Any, name: str = "tr") -> Any:
    """Lead + members ``worker`` and ``other``, traced by the team's ``tracer``."""
    return create_team(
        name=name,
        lead=lead(),
        members=[member("worker"), member("other")],
        runner={"max_concurrent_work_items": 4},
        tracer=tracer,
    )


@pytest.fixture
async def cluster(test_prefix):
    c = Cluster(test_prefix)
    yield c
    await c.close()


async def task_messages(worker: Worker, team: str) -> list[Any]:
    out = []
    for box in await worker.ctx.mailbox.mailbox_ids(f"{team}::"):
        out += [
            m
            for m in await worker.ctx.mailbox.inbox(box, "all")
            if m.work_item_id and not box.endswith("::lead")
        ]
    return out


async def test_a_run_keeps_its_root_carrier_in_the_record_and_every_task_message(cluster, raw, test_prefix):
    tracer_a, exp_a = otel()
    tracer_b, exp_b = otel()
    a = cluster.worker(traced_team(tracer_a), exporter=exp_a)
    b = cluster.worker(traced_team(tracer_b), exporter=exp_b)
    run_id = await cluster.submit(a, "tr", PLAN)
    assert await cluster.run(a, only=RUN_LEAD_TASK) == ["suspended"]

    record = await a.ctx.runs.get(run_id)
    [root] = [s for s in a.spans() if s.parent is None]  # ended with the first segment
    assert root.name == "invoke_workflow tr" and root.attributes["lattice.run_id"] == run_id
    assert set(record.trace_carrier) == {"traceparent"}
    assert record.trace_carrier["traceparent"].startswith(
        f"00-{root.context.trace_id:032x}-{root.context.span_id:016x}-"
    )
    assert (
        json.loads(raw.hget(f"{test_prefix}:run:{{run:{run_id}}}", "trace_carrier")) == record.trace_carrier
    )
    messages = await task_messages(a, "tr")
    assert len(messages) == 2
    assert all(m.metadata[TRACE_CARRIER_KEY] == record.trace_carrier for m in messages)

    # the members and the resume run in the other "process": children of the ended root
    await cluster.run(b)
    assert (await b.ctx.runs.get(run_id)).status.value == "completed"
    spans_b = b.spans()
    assert {s.context.trace_id for s in a.spans() + spans_b} == {root.context.trace_id}
    agents = {s.name: s for s in spans_b if s.name.startswith("invoke_agent")}
    assert set(agents) == {"invoke_agent worker", "invoke_agent other", "invoke_agent lead"}
    for span in agents.values():
        assert span.parent.span_id == root.context.span_id and span.parent.is_remote
    assert not [s for s in spans_b if s.parent is None]  # one root for the whole run
    # the record's carrier did not change: the first root stays the run's root
    assert (await b.ctx.runs.get(run_id)).trace_carrier == record.trace_carrier


async def test_an_untraced_run_writes_no_carrier_and_its_messages_carry_none(cluster, raw, test_prefix):
    a = cluster.worker(traced_team(None))
    run_id = await cluster.submit(a, "tr", PLAN)
    assert await cluster.run(a, only=RUN_LEAD_TASK) == ["suspended"]
    messages = await task_messages(a, "tr")
    assert len(messages) == 2 and all(TRACE_CARRIER_KEY not in m.metadata for m in messages)
    await cluster.run(a)
    record = await a.ctx.runs.get(run_id)
    assert record.status.value == "completed" and record.trace_carrier is None
    assert not raw.hexists(f"{test_prefix}:run:{{run:{run_id}}}", "trace_carrier")


async def test_without_a_team_tracer_the_lead_traces_the_run_and_members_continue_it_with_their_own(cluster):
    lead_tracer, lead_exp = otel()
    member_tracer, member_exp = otel()
    team = create_team(
        name="own",
        lead=lead(lead_tracer),
        members=[member("worker", member_tracer), member("other")],  # "other" has no tracer
        runner={"max_concurrent_work_items": 4},
    )
    assert run_tracer(team) is lead_tracer
    a = cluster.worker(team)
    run_id = await cluster.submit(a, "own", PLAN)
    await cluster.run(a)
    assert (await a.ctx.runs.get(run_id)).status.value == "completed"
    lead_spans = list(lead_exp.get_finished_spans())
    [root] = [s for s in lead_spans if s.parent is None]
    assert root.name == "invoke_workflow own"
    assert sorted(s.name for s in lead_spans if s.name.startswith("invoke_")) == [
        "invoke_agent lead",
        "invoke_agent lead",
        "invoke_workflow own",
    ]
    member_spans = list(member_exp.get_finished_spans())
    [worker_run] = [s for s in member_spans if s.name.startswith("invoke_")]
    assert worker_run.name == "invoke_agent worker"
    assert worker_run.context.trace_id == root.context.trace_id
    assert worker_run.parent.span_id == root.context.span_id


async def test_a_child_run_of_a_nested_team_continues_its_parent_runs_trace(cluster):
    tracer, exporter = otel()
    eng = create_team(name="tr_eng", lead=lead(), members=[member("backend")])
    company = create_team(
        name="tr_company", lead=lead(), members=[team_member(name="eng", agent=eng)], tracer=tracer
    )
    a = cluster.worker(company, exporter=exporter)
    assert a.ctx.registry.get("tr_eng").tracer is tracer  # the nested team inherits the parent's tracer
    inner = plan(("backend", "ask", "x"))
    run_id = await cluster.submit(a, "tr_company", plan(("eng", "ask", inner)))
    await cluster.run(a)
    parent = await a.ctx.runs.get(run_id)
    assert parent.status.value == "completed", parent
    [child] = [r for r in await a.ctx.runs.list_runs() if r.parent is not None]
    assert child.metadata["lattice_parent"][TRACE_CARRIER_KEY] == parent.trace_carrier
    assert child.trace_carrier is not None and child.trace_carrier != parent.trace_carrier
    spans = a.spans()
    assert {s.context.trace_id for s in spans} == {spans[0].context.trace_id}
    roots = {s.name: s for s in spans if s.name.startswith("invoke_workflow")}
    assert set(roots) == {"invoke_workflow tr_company", "invoke_workflow tr_eng"}
    assert roots["invoke_workflow tr_company"].parent is None
    assert (
        roots["invoke_workflow tr_eng"].parent.span_id == roots["invoke_workflow tr_company"].context.span_id
    )
    [backend] = [s for s in spans if s.name == "invoke_agent backend"]
    assert backend.parent.span_id == roots["invoke_workflow tr_eng"].context.span_id


async def test_a_tracer_that_propagates_nothing_still_gets_one_root_per_run(cluster, tmp_path):
    # JSONL gives an empty carrier: it is stored all the same, so no later segment opens a second root
    path = tmp_path / "trace.jsonl"
    a = cluster.worker(traced_team(create_jsonl_context_tracer(path=str(path))))
    run_id = await cluster.submit(a, "tr", PLAN)
    await cluster.run(a)
    record = await a.ctx.runs.get(run_id)
    assert record.status.value == "completed" and record.trace_carrier == {}
    events = [json.loads(line) for line in path.read_text().splitlines()]
    starts = [e for e in events if e["type"] == "run_start"]
    assert [e["source"]["kind"] for e in starts].count("team") == 1
    assert sorted(e["source"]["kind"] for e in starts) == [
        "team",
        "team_lead",
        "team_lead",
        "team_member",
        "team_member",
    ]
    assert {e["session_id"] for e in events} == {run_id}
    assert all(e.get("parent_run_id") == run_id for e in starts if e["source"]["kind"] != "team")
    [root_end] = [e for e in events if e["run_id"] == run_id and e["type"] == "result"]
    assert root_end["data"]["subtype"] == "suspended" and root_end["data"]["is_error"] is False


async def test_set_trace_carrier_is_fenced_and_keeps_the_first_carrier(ctx):
    runs = ctx.runs
    await runs.create("r1", "t", "p")
    start = await runs.begin_segment("r1", expect="queued", lease_s=5)
    with pytest.raises(RunLeaseLostError):
        await runs.set_trace_carrier("r1", "not-the-token", {"traceparent": "x"})
    assert (await runs.get("r1")).trace_carrier is None
    assert await runs.set_trace_carrier("r1", start.token, {"traceparent": "first"}) is True
    assert await runs.set_trace_carrier("r1", start.token, {"traceparent": "second"}) is False
    assert (await runs.get("r1")).trace_carrier == {"traceparent": "first"}
    with pytest.raises(ValueError, match="dict of strings"):
        runs.set_trace_carrier_call("r1", start.token, {"traceparent": 1})
    with pytest.raises(RunLeaseLostError):  # an unknown run is not held by any token
        await runs.set_trace_carrier("nope", start.token, {})


async def test_a_submitted_run_continues_its_callers_trace(cluster):
    """``submit(trace_parent=...)`` (default: the active OpenTelemetry span): the run's
    root is a child of the caller's span, in the caller's trace."""
    tracer_a, exp_a = otel()
    a = cluster.worker(traced_team(tracer_a), exporter=exp_a)
    caller = TracerProvider().get_tracer("caller")  # the calling service's own tracing
    with caller.start_as_current_span("POST /ask") as span:
        active = with_caller_trace({"k": "v"})  # what submit stores: the active span's carrier
    assert active["k"] == "v" and set(active[CALLER_KEY]["trace_carrier"]) == {"traceparent"}
    given = f"00-{'ab' * 16}-{'cd' * 8}-01"
    explicit = with_caller_trace(None, given)
    assert explicit == {CALLER_KEY: {"trace_carrier": {"traceparent": given}}}
    assert with_caller_trace(None) is None  # no active span, nothing given: a trace of its own
    for bad in ("not-a-traceparent", {"traceparent": "00-xyz"}, {"traceparent": 1}, 42):
        with pytest.raises(ValueError, match="trace_parent"):
            with_caller_trace(None, bad)

    runs = {}
    for name, metadata in (("active", active), ("explicit", explicit)):
        runs[name] = f"run_{name}"
        await a.ctx.runs.create(runs[name], "tr", PLAN, metadata=metadata)
        cluster.sent.append((RUN_LEAD_TASK, runs[name]))
    await cluster.run(a)
    roots = {s.attributes["lattice.run_id"]: s for s in a.spans() if s.name == "invoke_workflow tr"}
    caller_ctx = span.get_span_context()
    active_root = roots[runs["active"]]
    assert active_root.parent.is_remote and active_root.parent.span_id == caller_ctx.span_id
    assert active_root.context.trace_id == caller_ctx.trace_id
    explicit_root = roots[runs["explicit"]]
    assert (explicit_root.context.trace_id, explicit_root.parent.span_id) == (
        int("ab" * 16, 16),
        int("cd" * 8, 16),
    )
