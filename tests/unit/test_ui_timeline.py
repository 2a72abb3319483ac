"""The operations page's timeline of a run, built from its events (lattice_client/ui/timeline.py).

The events are those a real run writes (their shapes as tests/e2e shows them):
a lead segment that asks a member and suspends, the member's claim on a
worker, a crash and a second claim, the resume segment and the result.
"""

from __future__ import annotations

from lattice_client.registry import WorkerInfo
from lattice_client.ui.timeline import build_timeline, entry_ms, one_line, summarize, worker_label

WORKER = WorkerInfo(node="lattice.e2e.1a2b3c4d@vm", hostname="vm", pid=4242, queues=["p.e2e.worker"])


def _message(subtype: str, **fields):
    base = {
        "id": "m1",
        "from": "e2e::lead",
        "to": "e2e::worker",
        "content": "alpha",
        "work_item_id": "wi_1",
        "metadata": {"kind": "task", "mode": "ask", "run_id": "r1"},
    }
    return {"type": "team_message", "subtype": subtype, "team": "e2e", "message": {**base, **fields}}


def _events():
    tool_use = {"type": "tool_use", "id": "toolu_0", "name": "worker", "input": {"task": "alpha"}}
    return [
        ("1000-0", {"type": "system", "subtype": "init", "name": "lead"}),
        ("1001-0", {"type": "assistant", "message": {"role": "assistant", "content": [tool_use]}}),
        ("1002-0", _message("sent")),
        ("1003-0", {"type": "run_status", "status": "suspended", "run_id": "r1"}),
        ("1010-0", _message("claimed", claimed_by="vm:999:abcdef", attempts=1, lease_until=6010)),
        ("1011-0", {"type": "team_agent", "subtype": "start", "member": "worker", "work_item_id": "wi_1"}),
        (
            "1012-0",
            {
                "type": "agent_message",
                "member": "worker",
                "message": {
                    "type": "assistant",
                    "message": {"content": [{"type": "text", "text": "working"}]},
                },
            },
        ),
        ("9000-0", _message("claimed", claimed_by="vm:4242:123456", attempts=2, lease_until=14000)),
        ("9001-0", {"type": "team_agent", "subtype": "start", "member": "worker", "work_item_id": "wi_1"}),
        (
            "9002-0",
            _message(
                "reply", id="m2", **{"from": "e2e::worker", "to": "e2e::lead", "content": "worked[alpha]"}
            ),
        ),
        ("9003-0", _message("done")),
        (
            "9004-0",
            {
                "type": "team_agent",
                "subtype": "end",
                "member": "worker",
                "work_item_id": "wi_1",
                "result": "success",
            },
        ),
        ("9010-0", {"type": "system", "subtype": "init", "name": "lead"}),
        ("9011-0", {"type": "assistant", "message": {"content": [{"type": "text", "text": "final: ok"}]}}),
        ("9012-0", {"type": "run_result", "run_id": "r1", "status": "completed", "result": "final: ok"}),
    ]


def test_segments_are_the_leads_turns_from_init_to_how_they_ended():
    timeline = build_timeline(_events(), [WORKER])
    assert [(s.number, s.started_ms, s.end, s.ended_ms) for s in timeline.segments] == [
        (1, 1000, "suspended", 1003),
        (2, 9010, "completed", 9012),
    ]
    assert timeline.segments[0].tool_calls == ["worker"]
    assert timeline.segments[1].turns == 1


def test_a_member_step_lists_each_claim_on_the_worker_that_made_it():
    [step] = build_timeline(_events(), [WORKER]).steps
    assert (step.work_item_id, step.member, step.task, step.mode, step.status) == (
        "wi_1",
        "e2e::worker",
        "alpha",
        "ask",
        "done",
    )
    assert step.reply == "worked[alpha]"
    first, second = step.attempts
    # the first claim's process is gone (a crash); the second is a live worker, named by its node
    assert (first.number, first.worker, first.lease_until_ms, first.result) == (
        1,
        "vm pid 999 (not a live worker now)",
        6010,
        None,
    )
    assert (second.number, second.worker, second.claimed_ms, second.ended_ms, second.result) == (
        2,
        "lattice.e2e.1a2b3c4d@vm",
        9000,
        9004,
        "success",
    )


def test_a_recovery_ends_the_stalled_segment_and_marks_the_next():
    events = [
        ("1-0", {"type": "system", "subtype": "init", "name": "lead"}),
        ("50-0", {"type": "run_status", "status": "recovering", "run_id": "r", "attempt": 2}),
        ("51-0", {"type": "system", "subtype": "init", "name": "lead"}),
    ]
    first, second = build_timeline(events).segments
    assert (first.end, first.ended_ms, first.recovery_attempt) == ("lease expired", 50, None)
    assert (second.end, second.recovery_attempt) == ("running", 2)


def test_rows_name_who_emitted_each_event_and_keep_unknown_kinds_as_json():
    rows = build_timeline([*_events(), ("9999-0", {"type": "budget_reached", "spent": 10, "budget": 5})]).rows
    assert [r.source for r in rows[:6]] == ["lead", "lead", "lead", "lead", "worker", "worker"]
    assert rows[6].source == "worker" and rows[6].summary == "working"  # a member's own turn, unwrapped
    assert rows[-2].final and rows[-2].summary == "completed: final: ok"
    assert rows[-1].kind == "budget_reached" and rows[-1].summary == '{"spent": 10, "budget": 5}'
    assert build_timeline(_events()).last_id == "9012-0"


def test_summaries_are_one_line_and_bounded():
    source, kind, text = summarize(
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "a\n\nb"}]}}
    )
    assert (source, kind, text) == ("lead", "assistant", "a b")
    assert len(one_line("x" * 1000)) == 240 and one_line("x" * 1000).endswith("…")
    assert entry_ms("1796486410034-3") == 1796486410034 and entry_ms("junk") == 0


def test_worker_labels():
    assert worker_label("drain:vm:77:abc", [WORKER]) == "lattice drain on vm (pid 77)"
    assert worker_label(None, [WORKER]) == "-"
    other_host = WorkerInfo(node="n@other", hostname="other", pid=4242)
    assert worker_label("vm:4242:x", [other_host]) == "vm pid 4242 (not a live worker now)"


def test_each_lead_segment_names_the_worker_its_lead_segment_event_names():
    events = [
        ("1-0", {"type": "lead_segment", "run_id": "r", "worker": "vm:999:abcdef", "attempt": 1}),
        ("2-0", {"type": "system", "subtype": "init", "name": "lead"}),
        ("3-0", {"type": "run_status", "status": "suspended", "run_id": "r"}),
        ("8-0", {"type": "lead_segment", "run_id": "r", "worker": "vm:4242:123456", "attempt": 1}),
        ("9-0", {"type": "system", "subtype": "init", "name": "lead"}),
        ("10-0", {"type": "system", "subtype": "init", "name": "lead"}),  # an older worker's: no event
    ]
    timeline = build_timeline(events, [WORKER])
    assert [(s.number, s.claimed_by, s.worker) for s in timeline.segments] == [
        (1, "vm:999:abcdef", "vm pid 999 (not a live worker now)"),
        (2, "vm:4242:123456", "lattice.e2e.1a2b3c4d@vm"),
        (3, "", "-"),
    ]
    assert timeline.rows[0].summary == "the lead's segment starts on vm:999:abcdef (attempt 1)"
