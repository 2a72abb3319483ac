"""End-to-end: a distributed run is one OpenTelemetry trace across real worker processes.

The "e2e_traced" team (tests/e2e/traced_teams.py) is traced by an OpenTelemetry
tracer whose spans each worker process appends to its own file (the file named
by ``TEST_SPANS_FILE`` in that worker's environment). The lead runs on one
``lattice worker`` process, the members on another; the test reads both files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.teams import plan
from tests.e2e.traced_teams import BATCH_ENV, SPANS_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]

TEAM = "tests.e2e.traced_teams:traced_team"
SUSPENDED = r"Task lattice\.run_lead\[[^\]]+\] succeeded in [0-9.e-]+s: 'suspended'"


def spans_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def lead_worker(d: Any, spans: Path) -> Any:
    return d.worker(TEAM, "--member", "lead", "--concurrency", "1", env={SPANS_ENV: str(spans)})


def member_worker(d: Any, spans: Path) -> Any:
    """One worker for both members (``worker`` and ``other``)."""
    return d.worker(
        TEAM, "--member", "worker", "--member", "other", "--concurrency", "1", env={SPANS_ENV: str(spans)}
    )


def check_run_tree(run_id: str, lead_spans: list[dict[str, Any]], member_spans: list[dict[str, Any]]) -> dict:
    """The shape every traced run of the plan ``worker handoff a, other ask b``
    has, wherever its segments ran; returns the root span."""
    everything = lead_spans + member_spans
    assert {s["trace_id"] for s in everything} == {everything[0]["trace_id"]}, (
        "one trace id for the whole run"
    )
    [root] = [s for s in everything if s["parent_span_id"] is None]
    assert root in lead_spans  # opened (and ended) by the first lead segment
    assert root["name"] == "invoke_workflow e2e_traced"
    attrs = root["attributes"]
    assert attrs["gen_ai.operation.name"] == "invoke_workflow"
    assert attrs["gen_ai.workflow.name"] == "e2e_traced"
    assert attrs["lattice.run_id"] == run_id and attrs["gen_ai.conversation.id"] == run_id
    assert attrs["lattice.source.kind"] == "team"
    assert root["status"] != "ERROR"

    segments = sorted(named(lead_spans, "invoke_agent lead"), key=lambda s: s["start"])
    assert len(segments) == 2  # the first segment and the resume
    for segment in segments:
        assert segment["parent_span_id"] == root["span_id"]
        assert segment["attributes"]["lattice.source.kind"] == "team_lead"
        assert segment["attributes"]["lattice.team"] == "e2e_traced"
        assert segment["attributes"]["gen_ai.conversation.id"] == run_id
    # the root ended inside the first segment, before the resume began
    assert root["end"] <= segments[1]["start"]
    # the first segment called both members (tool spans under it), the resume answered
    calls = sorted(s["name"] for s in lead_spans if s["parent_span_id"] == segments[0]["span_id"])
    assert [c for c in calls if c.startswith("execute_tool")] == ["execute_tool other", "execute_tool worker"]
    resumed = [s for s in lead_spans if s["parent_span_id"] == segments[1]["span_id"]]
    assert len(resumed) == 1 and resumed[0]["name"].startswith("chat "), resumed  # one turn: the answer

    for member in ("worker", "other"):
        [run] = named(member_spans, f"invoke_agent {member}")
        assert run["parent_span_id"] == root["span_id"]
        assert run["attributes"]["lattice.source.kind"] == "team_member"
        assert run["attributes"]["lattice.member"] == member
        assert run["attributes"]["gen_ai.conversation.id"] == run_id
        children = [s for s in member_spans if s["parent_span_id"] == run["span_id"]]
        assert {s["name"] for s in children if s["name"].startswith("execute_tool")} == {
            "execute_tool work",
            "execute_tool team_reply",
        }
        chats = [s for s in children if s["name"].startswith("chat ")]
        assert chats and all(
            s["kind"] == "CLIENT" and s["attributes"]["gen_ai.operation.name"] == "chat" for s in chats
        )
    return root


def test_a_run_is_one_trace_across_the_lead_worker_and_the_member_worker(deployment, tmp_path):
    d = deployment
    lead_file, member_file = tmp_path / "lead-spans.jsonl", tmp_path / "member-spans.jsonl"
    lead, members = lead_worker(d, lead_file), member_worker(d, member_file)
    handle = d.client.submit(TEAM, plan(("worker", "handoff", "a"), ("other", "ask", "b")))
    result = handle.wait(timeout=60)
    assert result.status == "completed", result
    assert result.result == "final: ask:worked[b] | done:worked[a]"

    lead_spans, member_spans = spans_of(lead_file), spans_of(member_file)
    assert {s["pid"] for s in lead_spans}.isdisjoint({s["pid"] for s in member_spans})
    check_run_tree(handle.run_id, lead_spans, member_spans)
    # the carrier the first segment stored is the root's W3C traceparent
    record = d.client.get_run(handle.run_id)
    [root] = [s for s in lead_spans if s["parent_span_id"] is None]
    assert set(record.trace_carrier) == {"traceparent"}
    assert record.trace_carrier["traceparent"].startswith(f"00-{root['trace_id']}-{root['span_id']}-")
    lead.stop()
    members.stop()


def test_a_resume_on_another_lead_worker_stays_in_the_trace(deployment, tmp_path):
    d = deployment
    first_file, member_file, second_file = (
        tmp_path / f"{n}-spans.jsonl" for n in ("first", "members", "second")
    )
    first = lead_worker(d, first_file)
    handle = d.client.submit(TEAM, plan(("worker", "handoff", "a"), ("other", "ask", "b")))
    first.wait_log(SUSPENDED, timeout=45)
    first.stop()  # the first segment's process is gone before anyone resumes the run

    member_worker(d, member_file)
    second = lead_worker(d, second_file)
    result = handle.wait(timeout=60)
    assert result.status == "completed", result
    assert "Task lattice.resume_lead" in second.log()

    first_spans, second_spans = spans_of(first_file), spans_of(second_file)
    assert [s["name"] for s in second_spans if s["name"].startswith("invoke_")] == ["invoke_agent lead"]
    assert not [s for s in second_spans if s["parent_span_id"] is None]  # no second root
    root = check_run_tree(handle.run_id, first_spans + second_spans, spans_of(member_file))
    [resumed] = named(second_spans, "invoke_agent lead")
    assert resumed["parent_span_id"] == root["span_id"]


def test_a_worker_flushes_its_tracers_when_it_shuts_down(deployment, tmp_path):
    # spans an exporter still buffers when the worker stops are not lost: the pool
    # process flushes the tracers of its teams on its way out
    d = deployment
    spans = tmp_path / "batched-spans.jsonl"
    worker = d.worker(TEAM, "--concurrency", "1", env={SPANS_ENV: str(spans), BATCH_ENV: "1"})
    handle = d.client.submit(TEAM, plan(("worker", "handoff", "a")))
    assert handle.wait(timeout=60).status == "completed"
    assert spans_of(spans) == []  # all of the run's spans are still in the batch queue
    worker.stop()
    exported = spans_of(spans)
    assert len({s["trace_id"] for s in exported}) == 1
    assert {"invoke_workflow e2e_traced", "invoke_agent lead", "invoke_agent worker"} <= {
        s["name"] for s in exported
    }
