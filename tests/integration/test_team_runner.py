"""Mailbox teams in one process: handoffs, receipts, reports, concurrency,
failure isolation, abort, events and tracing.

Modes, receipts, controlled handoff concurrency, handoff failure isolation and
team tracing; docs/architecture.md, "Teams in one process".
Every test runs against MemoryMailbox and RedisMailbox (real Redis on
127.0.0.1:6379, a unique key prefix per test, keys deleted after).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from lattice_mailbox import MessageStatus
from lattice_worker import (
    AbortController,
    AssistantModelMessage,
    ModelRequest,
    ScriptedModelClient,
    ToolContext,
    create_agent,
    define_agent,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.team import create_team, parse_report_message, team_member
from lattice_worker.tracing.base import define_context_tracer

# --------------------------------------------------------------------------- helpers


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def first_prompt(request: ModelRequest) -> str:
    return _text(request.messages[0]["content"])


def task_of(prompt: str) -> str:
    """The task text inside a member prompt (between the assignment line and the closing rules)."""
    body = prompt.split(":\n\n", 1)[1]
    return body.split("\n\nWhen your work is finished", 1)[0]


def has_tool_results(request: ModelRequest) -> bool:
    """The request answers a tool call: its last block is a tool_result (a new prompt after
    earlier results joins their user turn, after them)."""
    last = request.messages[-1]
    return isinstance(last["content"], list) and last["content"][-1].get("type") == "tool_result"


def replying_client(answer: Any) -> ScriptedModelClient:
    """A stateless member model: replies ``answer(prompt)`` with team_reply on its first turn."""

    def play(request: ModelRequest) -> AssistantModelMessage:
        if not has_tool_results(request):
            return tool_turn(("team_reply", {"content": answer(first_prompt(request))}))
        return text_turn("done")

    return ScriptedModelClient(play)


def reports_of(request: ModelRequest) -> list[dict[str, Any]]:
    for message in reversed(request.messages):
        entries = parse_report_message(message)
        if entries:
            return entries
    return []


def summarising_lead(*first_calls: tuple[str, dict[str, Any]]) -> ScriptedModelClient:
    """A lead that makes ``first_calls`` in one batch, then answers with the reports it got."""
    return ScriptedModelClient(
        [
            tool_turn(*first_calls),
            lambda req: text_turn(
                "summary: " + json.dumps([(r["member"], r["status"], r["content"]) for r in reports_of(req)])
            ),
        ]
    )


async def collect(team: Any, prompt: str, **options: Any) -> list[Any]:
    return [event async for event in team.query(prompt, **options)]


# --------------------------------------------------------------------------- tests


async def test_handoff_receipt_and_report_reach_the_lead(mailbox: Any) -> None:
    worker = create_agent(
        name="worker", model_client=replying_client(lambda p: "worked on: " + task_of(p).split("\n\n")[0])
    )
    lead_client = summarising_lead(
        ("worker", {"mode": "handoff", "task": "count the files", "expected_output": "a number"})
    )
    team = create_team(
        name="t1",
        lead=create_agent(name="boss", model_client=lead_client),
        members=[team_member(name="worker", agent=worker)],
        mailbox=mailbox,
    )
    events = await collect(team, "please count", stream=False)

    user = next(e for e in events if e.type == "user")
    receipt = json.loads(user.message["content"][0]["content"])
    assert receipt["status"] == "accepted"
    assert receipt["phase"] == "queued"
    assert receipt["completion_pending"] is True
    assert receipt["thread_id"] == receipt["message_id"]
    assert receipt["work_item_id"].startswith("wi_")
    assert receipt["member"] == "worker"

    task = await mailbox.get(receipt["message_id"])
    assert task.status == MessageStatus.DONE
    assert task.from_ == "t1::lead" and task.to == "t1::worker"
    assert task.metadata["mode"] == "handoff"
    assert task.metadata["tool_use_id"] == user.message["content"][0]["tool_use_id"]
    assert "Expected output: a number" in task.content

    reply = [m for m in await mailbox.inbox("t1::lead", "all") if m.reply_to == task.id]
    assert len(reply) == 1
    assert reply[0].work_item_id == task.work_item_id and reply[0].thread_id == task.thread_id
    assert reply[0].content.startswith("worked on: ")

    second = lead_client.requests[1]
    entries = reports_of(second)
    assert entries == [
        {
            "member": "worker",
            "message_id": task.id,
            "work_item_id": task.work_item_id,
            "thread_id": task.thread_id,
            "status": "done",
            "content": reply[0].content,
            "report_message_id": reply[0].id,
        }
    ]
    final = events[-1]
    assert final.type == "result" and final.subtype == "success"
    assert '"worker", "done", "worked on: count the files"' in final.result


async def test_two_handoffs_overlap_with_concurrency_two_but_one_mailbox_stays_serial(mailbox: Any) -> None:
    log: list[tuple[str, str, str]] = []
    started = {"a": asyncio.Event(), "b": asyncio.Event()}
    active: dict[str, int] = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0, "total": 0}

    def work_tool(member: str) -> Any:
        other = "b" if member == "a" else "a"

        @tool(name="work", description="Do the work.")
        async def work(label: str) -> str:
            active[member] += 1
            peak[member] = max(peak[member], active[member])
            peak["total"] = max(peak["total"], active["a"] + active["b"])
            log.append(("start", member, label))
            started[member].set()
            # An ordering barrier, not a timer: with two slots the other member starts meanwhile.
            await asyncio.wait_for(started[other].wait(), timeout=10)
            log.append(("end", member, label))
            active[member] -= 1
            return f"{label} ok"

        return work

    def member_client() -> ScriptedModelClient:
        def play(request: ModelRequest) -> AssistantModelMessage:
            prompt = first_prompt(request)
            label = task_of(prompt)
            if len(request.messages) == 1:
                return tool_turn(("work", {"label": label}))
            return tool_turn(("team_reply", {"content": f"{label} finished"}))

        return ScriptedModelClient(play)

    a = define_agent(name="a", model_client=member_client(), tools=[work_tool("a")])
    b = define_agent(name="b", model_client=member_client(), tools=[work_tool("b")])
    lead_client = summarising_lead(
        ("a", {"mode": "handoff", "task": "a-1"}),
        ("b", {"mode": "handoff", "task": "b-1"}),
        ("a", {"mode": "handoff", "task": "a-2"}),
    )
    team = create_team(
        name="t2",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="a", agent=a), team_member(name="b", agent=b)],
        mailbox=mailbox,
        runner={"max_concurrent_work_items": 2},
    )
    result = await team.prompt("go", stream=False)
    assert result.subtype == "success"

    def index(kind: str, member: str, label: str) -> int:
        return log.index((kind, member, label))

    # a-1 and b-1 overlap in time: each started before the other ended.
    assert index("start", "b", "b-1") < index("end", "a", "a-1")
    assert index("start", "a", "a-1") < index("end", "b", "b-1")
    # the two items of mailbox a never overlap: a-2 starts after a-1 ended.
    assert index("end", "a", "a-1") < index("start", "a", "a-2")
    assert peak["a"] == 1 and peak["b"] == 1 and peak["total"] == 2
    # reports in handoff order
    assert [(r["member"], r["content"]) for r in reports_of(lead_client.requests[1])] == [
        ("a", "a-1 finished"),
        ("b", "b-1 finished"),
        ("a", "a-2 finished"),
    ]


GRACE_SECONDS = 0.25
"""How long a member that started early keeps its work item open so that a runner
which ignores its limits can show it (it starts more items meanwhile). Nothing
asserts on time: a correct runner passes however slow the machine is."""


def counting_tool(state: dict[str, int], expected: int, key: str = "all") -> Any:
    """A ``work`` tool counting items of ``key`` running at once (``state[key]`` /
    ``state[key + "_peak"]``); each stays open until ``expected`` items of ``key``
    started or the grace period ends."""
    everyone = asyncio.Event()

    @tool(name="work", description="Do the work.")
    async def work() -> str:
        state[key] = state.get(key, 0) + 1
        state[key + "_started"] = state.get(key + "_started", 0) + 1
        state[key + "_peak"] = max(state.get(key + "_peak", 0), state[key])
        if state[key + "_started"] >= expected:
            everyone.set()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(everyone.wait(), GRACE_SECONDS)
        state[key] -= 1
        return "ok"

    return work


def working_member(name: str, work: Any) -> Any:
    """A spec member (a fresh session per item, so nothing but the runner keeps
    its items apart) that calls ``work`` once, then replies with its task."""

    def play(request: ModelRequest) -> AssistantModelMessage:
        if len(request.messages) == 1:
            return tool_turn(("work", {}))
        return tool_turn(("team_reply", {"content": task_of(first_prompt(request)) + " done"}))

    return define_agent(name=name, model_client=ScriptedModelClient(play), tools=[work])


@pytest.mark.parametrize("limit", [1, 2])
async def test_max_concurrent_work_items_bounds_the_items_running_at_once(mailbox: Any, limit: int) -> None:
    state: dict[str, int] = {}
    work = counting_tool(state, expected=3)
    lead_client = summarising_lead(*[(n, {"mode": "handoff", "task": f"{n}-1"}) for n in ("a", "b", "c")])
    team = create_team(
        name=f"tl{limit}",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name=n, agent=working_member(n, work)) for n in ("a", "b", "c")],
        mailbox=mailbox,
        runner={"max_concurrent_work_items": limit},
    )
    events = await collect(team, "go", stream=False)
    assert events[-1].subtype == "success"
    assert state["all_peak"] == limit  # reached, never exceeded
    assert [(r["member"], r["content"]) for r in reports_of(lead_client.requests[1])] == [
        ("a", "a-1 done"),
        ("b", "b-1 done"),
        ("c", "c-1 done"),
    ]
    running = peak = 0
    for event in events:  # the runtime's own start/end events agree
        if event.type == "team_agent":
            running += 1 if event.subtype == "start" else -1
            peak = max(peak, running)
    assert peak == limit


async def test_items_of_one_mailbox_never_overlap_even_with_free_slots(mailbox: Any) -> None:
    state: dict[str, int] = {}
    a_work = counting_tool(state, expected=2, key="a")
    b_work = counting_tool(state, expected=1, key="b")
    lead_client = summarising_lead(
        ("a", {"mode": "handoff", "task": "a-1"}),
        ("b", {"mode": "handoff", "task": "b-1"}),
        ("a", {"mode": "handoff", "task": "a-2"}),
    )
    team = create_team(
        name="tm1",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[
            team_member(name="a", agent=working_member("a", a_work)),
            team_member(name="b", agent=working_member("b", b_work)),
        ],
        mailbox=mailbox,
        runner={"max_concurrent_work_items": 5},
    )
    events = await collect(team, "go", stream=False)
    assert state["a_peak"] == 1 and state["a_started"] == 2
    a_agent = [(e.subtype, e.message_id) for e in events if e.type == "team_agent" and e.member == "a"]
    first, second = a_agent[0][1], a_agent[2][1]
    assert a_agent == [("start", first), ("end", first), ("start", second), ("end", second)]
    assert [r["content"] for r in reports_of(lead_client.requests[1])] == ["a-1 done", "b-1 done", "a-2 done"]


async def test_default_runner_is_serial_and_reports_keep_handoff_order(mailbox: Any) -> None:
    log: list[str] = []
    a_done = asyncio.Event()

    @tool(name="step", description="A step.")
    async def step_a() -> str:
        log.append("a-start")
        log.append("a-end")
        a_done.set()
        return "ok"

    @tool(name="step", description="A step.")
    async def step_b() -> str:
        log.append("b-start")
        log.append("b-end")
        return "ok"

    def client(tag: str) -> ScriptedModelClient:
        return ScriptedModelClient(
            lambda r: (
                tool_turn(("step", {}))
                if len(r.messages) == 1
                else tool_turn(("team_reply", {"content": f"{tag} report"}))
            )
        )

    lead_client = summarising_lead(
        ("b", {"mode": "handoff", "task": "first"}), ("a", {"mode": "handoff", "task": "second"})
    )
    team = create_team(
        name="t3",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[
            team_member(name="a", agent=create_agent(name="a", model_client=client("A"), tools=[step_a])),
            team_member(name="b", agent=create_agent(name="b", model_client=client("B"), tools=[step_b])),
        ],
        mailbox=mailbox,
    )
    events = await collect(team, "go", stream=False)
    assert log == ["b-start", "b-end", "a-start", "a-end"]  # serial, in handoff order
    assert [r["content"] for r in reports_of(lead_client.requests[1])] == ["B report", "A report"]
    starts = [e.member for e in events if e.type == "team_agent" and e.subtype == "start"]
    assert starts == ["b", "a"]


async def test_report_order_is_handoff_order_even_when_completion_order_differs(mailbox: Any) -> None:
    a_finished = asyncio.Event()

    @tool(name="wait_for_a", description="Wait until member a finished.")
    async def wait_for_a() -> str:
        await asyncio.wait_for(a_finished.wait(), timeout=10)
        return "a finished first"

    def a_play(request: ModelRequest) -> AssistantModelMessage:
        return tool_turn(("team_reply", {"content": "A report"}))

    def b_play(request: ModelRequest) -> AssistantModelMessage:
        if len(request.messages) == 1:
            return tool_turn(("wait_for_a", {}))
        return tool_turn(("team_reply", {"content": "B report"}))

    async def on_event(event: Any) -> None:
        if event.type == "team_message" and event.subtype == "done" and event.message["to"].endswith("::a"):
            a_finished.set()

    lead_client = summarising_lead(
        ("b", {"mode": "handoff", "task": "first"}), ("a", {"mode": "handoff", "task": "second"})
    )
    team = create_team(
        name="t4",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[
            team_member(name="a", agent=create_agent(name="a", model_client=ScriptedModelClient(a_play))),
            team_member(
                name="b",
                agent=create_agent(name="b", model_client=ScriptedModelClient(b_play), tools=[wait_for_a]),
            ),
        ],
        mailbox=mailbox,
        runner={"max_concurrent_work_items": 2},
    )
    events = []
    async for event in team.query("go", stream=False):
        events.append(event)
        await on_event(event)
    done_order = [e.message["to"] for e in events if e.type == "team_message" and e.subtype == "done"]
    assert done_order == ["t4::a", "t4::b"]  # events follow completion order
    entries = reports_of(lead_client.requests[1])
    assert [e["member"] for e in entries] == ["b", "a"]  # reports follow handoff order
    sent = [e.message["id"] for e in events if e.type == "team_message" and e.subtype == "sent"]
    assert [e["message_id"] for e in entries] == sent


async def test_lead_model_is_not_called_again_until_every_item_finished(mailbox: Any) -> None:
    seen: dict[str, Any] = {}

    async def second_turn(request: ModelRequest) -> AssistantModelMessage:
        statuses = {}
        for box in ("t5::a", "t5::b"):
            for message in await mailbox.inbox(box, "all"):
                statuses[message.content.split("\n\n")[0]] = message.status.value
        seen["statuses"] = statuses
        seen["member_calls"] = len(a_client.requests) + len(b_client.requests)
        return text_turn("all done")

    a_client = replying_client(lambda p: "A")
    b_client = ScriptedModelClient(
        [tool_turn(("noop", {})), tool_turn(("noop", {})), tool_turn(("team_reply", {"content": "B"}))]
    )

    @tool(name="noop", description="Nothing.")
    def noop() -> str:
        return "ok"

    lead_client = ScriptedModelClient(
        [
            tool_turn(
                ("a", {"mode": "handoff", "task": "task-a"}), ("b", {"mode": "handoff", "task": "task-b"})
            ),
            second_turn,
        ]
    )
    team = create_team(
        name="t5",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[
            team_member(name="a", agent=create_agent(name="a", model_client=a_client)),
            team_member(name="b", agent=create_agent(name="b", model_client=b_client, tools=[noop])),
        ],
        mailbox=mailbox,
    )
    result = await team.prompt("go", stream=False)
    assert result.result == "all done"
    assert len(lead_client.requests) == 2
    assert seen["statuses"] == {"task-a": "done", "task-b": "done"}
    assert seen["member_calls"] == 4  # a: 1 turn; b: 3 turns -- all before the lead's second request


async def test_member_max_turns_failure_is_isolated_and_lead_gets_both_reports(mailbox: Any) -> None:
    @tool(name="dig", description="Dig.")
    def dig() -> str:
        return "deeper"

    failing = create_agent(
        name="failing",
        model_client=ScriptedModelClient(lambda r: tool_turn(("dig", {}))),
        tools=[dig],
        max_turns=2,
    )
    healthy = create_agent(name="healthy", model_client=replying_client(lambda p: "healthy result"))
    lead_client = summarising_lead(
        ("failing", {"mode": "handoff", "task": "never ends"}),
        ("healthy", {"mode": "handoff", "task": "easy"}),
    )
    team = create_team(
        name="t6",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="failing", agent=failing), team_member(name="healthy", agent=healthy)],
        mailbox=mailbox,
        runner={"max_concurrent_work_items": 2},
    )
    events = await collect(team, "go", stream=False)
    final = events[-1]
    assert final.type == "result" and final.subtype == "success"  # the team does not reject

    failed = [e for e in events if e.type == "team_message" and e.subtype == "failed"]
    assert len(failed) == 1
    assert failed[0].error == {
        "code": "error_max_turns",
        "message": failed[0].error["message"],
        "error_type": "MaxTurnsError",
    }
    assert "max_turns=2" in failed[0].error["message"]
    assert failed[0].message["status"] == "failed"

    entries = reports_of(lead_client.requests[1])
    assert [(e["member"], e["status"]) for e in entries] == [("failing", "failed"), ("healthy", "done")]
    assert entries[0]["error"]["code"] == "error_max_turns"
    assert entries[1]["content"] == "healthy result"

    task = await mailbox.get(entries[0]["message_id"])
    assert task.status == MessageStatus.FAILED
    report = [m for m in await mailbox.inbox("t6::lead", "all") if m.reply_to == task.id][0]
    assert report.metadata["kind"] == "failure"
    assert report.metadata["error"]["error_type"] == "MaxTurnsError"
    assert (await mailbox.get(entries[1]["message_id"])).status == MessageStatus.DONE


async def test_member_api_error_is_a_normalised_failure(mailbox: Any) -> None:
    from lattice_worker import APIError

    broken = create_agent(
        name="broken", model_client=ScriptedModelClient([APIError("upstream 500", status_code=500)])
    )
    lead_client = summarising_lead(("broken", {"mode": "handoff", "task": "x"}))
    team = create_team(
        name="t7",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="broken", agent=broken)],
        mailbox=mailbox,
    )
    await team.prompt("go", stream=False)
    entry = reports_of(lead_client.requests[1])[0]
    assert entry["status"] == "failed"
    assert entry["error"] == {"code": "api_error", "message": "upstream 500", "error_type": "APIError"}


async def test_abort_during_handoffs_cancels_current_and_remaining_work(mailbox: Any) -> None:
    controller = AbortController()

    @tool(name="slow", description="Work that gets aborted.")
    async def slow(ctx: ToolContext) -> str:
        controller.abort("operator stop")
        return "partial"

    first = create_agent(
        name="first", model_client=ScriptedModelClient(lambda r: tool_turn(("slow", {}))), tools=[slow]
    )
    second_client = replying_client(lambda p: "never")
    second = create_agent(name="second", model_client=second_client)
    lead_client = ScriptedModelClient(
        [
            tool_turn(
                ("first", {"mode": "handoff", "task": "one"}), ("second", {"mode": "handoff", "task": "two"})
            )
        ]
    )
    team = create_team(
        name="t8",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="first", agent=first), team_member(name="second", agent=second)],
        mailbox=mailbox,
    )
    events = await collect(team, "go", stream=False, signal=controller.signal)
    final = events[-1]
    assert final.type == "result" and final.subtype == "error_abort"
    assert len(lead_client.requests) == 1
    assert second_client.requests == []  # never started
    for box in ("t8::first", "t8::second"):
        assert await mailbox.inbox(box, "pending") == []
        statuses = [m.status for m in await mailbox.inbox(box, "all")]
        assert statuses == [MessageStatus.CANCELLED]
    cancelled = [e for e in events if e.type == "team_message" and e.subtype == "cancelled"]
    assert sorted(e.message["to"] for e in cancelled) == ["t8::first", "t8::second"]
    assert all(e.error["code"] == "aborted" for e in cancelled)


def handoff_then_abort_team(name: str, mailbox: Any) -> tuple[Any, AbortController, ScriptedModelClient]:
    """A team whose lead, in one batch, hands task "t" off to member "m" and calls
    a ``stop`` tool that aborts the run. Returns the team, the run's abort
    controller and the member's model client."""
    controller = AbortController()

    @tool(name="stop", description="Abort the run.")
    def stop() -> str:
        controller.abort()
        return "stopped"

    member_client = replying_client(lambda p: "x")
    lead = create_agent(
        name="lead",
        tools=[stop],
        model_client=ScriptedModelClient([tool_turn(("m", {"mode": "handoff", "task": "t"}), ("stop", {}))]),
    )
    team = create_team(
        name=name,
        lead=lead,
        members=[team_member(name="m", agent=create_agent(name="m", model_client=member_client))],
        mailbox=mailbox,
    )
    return team, controller, member_client


async def test_abort_inside_the_lead_batch_leaves_no_accepted_handoff_pending(mailbox: Any) -> None:
    team, controller, member_client = handoff_then_abort_team("t9", mailbox)
    result = await team.prompt("go", stream=False, signal=controller.signal)
    assert result.subtype == "error_abort"
    assert member_client.requests == []
    assert [m.status for m in await mailbox.inbox("t9::m", "all")] == [MessageStatus.CANCELLED]


async def test_ask_mode_returns_the_member_answer_in_the_same_batch(mailbox: Any) -> None:
    member = create_agent(name="m", model_client=replying_client(lambda p: "the answer is 7"))
    lead_client = ScriptedModelClient(
        [
            tool_turn(("m", {"mode": "ask", "task": "what is 3+4?"})),
            lambda r: text_turn("lead says: " + _text(r.messages[-1]["content"][0]["content"])),
        ]
    )
    team = create_team(
        name="t10",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="m", agent=member)],
        mailbox=mailbox,
    )
    events = await collect(team, "go", stream=False)
    user = next(e for e in events if e.type == "user")
    block = user.message["content"][0]
    assert block["content"] == "the answer is 7" and not block.get("is_error")
    assert len(lead_client.requests[1].messages) == 3  # no report message after an ask
    assert events[-1].result == "lead says: the answer is 7"
    task = (await mailbox.inbox("t10::m", "all"))[0]
    assert task.status == MessageStatus.DONE and task.metadata["mode"] == "ask"


async def test_observe_mode_is_unsupported_and_sends_nothing(mailbox: Any) -> None:
    lead_client = ScriptedModelClient(
        [tool_turn(("m", {"mode": "observe", "task": "watch"})), text_turn("ok")]
    )
    team = create_team(
        name="t11",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[
            team_member(name="m", agent=create_agent(name="m", model_client=replying_client(lambda p: "x")))
        ],
        mailbox=mailbox,
    )
    events = await collect(team, "go", stream=False)
    block = next(e for e in events if e.type == "user").message["content"][0]
    assert block["is_error"] is True and "unsupported" in block["content"]
    assert await mailbox.inbox("t11::m", "all") == []


async def test_events_stream_member_activity_and_tracing_shares_one_session(mailbox: Any) -> None:
    traced: list[dict[str, Any]] = []
    tracer = define_context_tracer(on_event=traced.append)
    worker = create_agent(name="worker", model_client=replying_client(lambda p: "W"))
    lead = create_agent(
        name="boss", model_client=summarising_lead(("worker", {"mode": "handoff", "task": "x"}))
    )
    team = create_team(
        name="t12", lead=lead, members=[team_member(name="worker", agent=worker)], mailbox=mailbox
    )
    events = await collect(team, "go", stream=False, tracer=tracer)

    kinds = [
        (e.type, getattr(e, "subtype", None)) for e in events if e.type in ("team_message", "team_agent")
    ]
    assert kinds == [
        ("team_message", "sent"),
        ("team_message", "claimed"),
        ("team_agent", "start"),
        ("team_message", "reply"),
        ("team_message", "done"),
        ("team_agent", "end"),
    ]
    nested = [e.message["type"] for e in events if e.type == "agent_message"]
    assert nested[0] == "system" and nested[-1] == "result"
    assert all(
        e.member == "worker" and e.mailbox == "t12::worker" for e in events if e.type == "agent_message"
    )
    # the member events arrive while the lead waits: between the lead's user event and its next assistant turn
    types = [e.type for e in events]
    assert types.index("user") < types.index("agent_message") < len(types) - 2

    sessions = {e["session_id"] for e in traced}
    assert len(sessions) == 1
    root = [e for e in traced if e["source"]["kind"] == "team"]
    assert root[0]["type"] == "run_start" and root[-1]["type"] == "result"
    root_run = root[0]["run_id"]
    assert {e["run_id"] for e in root} == {root_run}
    lead_events = [e for e in traced if e["source"]["kind"] == "team_lead"]
    assert lead_events and all(e["parent_run_id"] == root_run for e in lead_events)
    assert lead_events[0]["agent_session_id"] == lead.session_id
    member_events = [e for e in traced if e["source"]["kind"] == "team_member"]
    assert {e["type"] for e in member_events} >= {"run_start", "model_request", "tool_use", "result"}
    assert all(
        e["source"] == {"kind": "team_member", "name": "worker", "member": "worker", "mailbox": "t12::worker"}
        and e["agent_session_id"] == worker.session_id
        and e["parent_run_id"] == root_run
        for e in member_events
    )
    team_events = [e["type"] for e in root]
    assert "team_message" in team_events and "team_agent" in team_events
    seqs = [e["seq"] for e in traced]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_spec_member_gets_a_fresh_session_per_work_item(mailbox: Any) -> None:
    client = replying_client(lambda p: "ok")
    spec = define_agent(name="fresh", model_client=client)
    lead_client = summarising_lead(
        ("fresh", {"mode": "handoff", "task": "one"}), ("fresh", {"mode": "handoff", "task": "two"})
    )
    team = create_team(
        name="t13",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="fresh", agent=spec)],
        mailbox=mailbox,
    )
    await team.prompt("go", stream=False)
    assert [len(r.messages) for r in client.requests] == [1, 1]  # no history carried over
    assert [e["status"] for e in reports_of(lead_client.requests[1])] == ["done", "done"]


async def test_live_member_keeps_its_history_across_work_items(mailbox: Any) -> None:
    client = replying_client(lambda p: "ok")
    live = create_agent(name="live", model_client=client)
    lead_client = summarising_lead(
        ("live", {"mode": "handoff", "task": "one"}), ("live", {"mode": "handoff", "task": "two"})
    )
    team = create_team(
        name="t14",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="live", agent=live)],
        mailbox=mailbox,
    )
    await team.prompt("go", stream=False)
    # prompt, reply call, then the reply's result and the new prompt in one user turn
    assert [len(r.messages) for r in client.requests] == [1, 3]


async def test_interrupt_while_members_work_lets_the_batch_finish_then_stops_the_lead(mailbox: Any) -> None:
    holder: dict[str, Any] = {}

    @tool(name="interrupt_lead", description="The host interrupts the team.")
    def interrupt_lead() -> str:
        holder["interrupted"] = holder["team"].interrupt()
        return "interrupted"

    member_client = ScriptedModelClient(
        [tool_turn(("interrupt_lead", {})), tool_turn(("team_reply", {"content": "finished anyway"}))]
    )
    lead_client = ScriptedModelClient(
        [tool_turn(("m", {"mode": "handoff", "task": "t"})), text_turn("never")]
    )
    lead = create_agent(name="lead", model_client=lead_client)
    team = create_team(
        name="t15",
        lead=lead,
        members=[
            team_member(
                name="m", agent=create_agent(name="m", model_client=member_client, tools=[interrupt_lead])
            )
        ],
        mailbox=mailbox,
    )
    holder["team"] = team
    result = await team.prompt("go", stream=False)
    assert holder["interrupted"] is True
    assert result.subtype == "interrupted" and result.is_error is False
    assert len(lead_client.requests) == 1  # the lead's next turn never happened
    task = (await mailbox.inbox("t15::m", "all"))[0]
    assert task.status == MessageStatus.DONE  # the accepted work finished first...
    history = await lead.get_history()
    assert (
        reports_of(ModelRequest(model=None, system=None, messages=history))[0]["content"] == "finished anyway"
    )
    assert team.interrupt() is False  # idle again


async def test_create_team_runner_query_and_emit_callback(mailbox: Any) -> None:
    from lattice_worker import ConfigError, create_team_runner

    def lead_play(request: ModelRequest) -> AssistantModelMessage:
        entries = reports_of(request)
        if entries:
            return text_turn("summary: " + entries[-1]["content"])
        return tool_turn(("m", {"mode": "handoff", "task": "t"}))

    seen: list[str] = []
    team = create_team(
        name="t16",
        lead=create_agent(name="lead", model_client=ScriptedModelClient(lead_play)),
        members=[
            team_member(name="m", agent=create_agent(name="m", model_client=replying_client(lambda p: "R")))
        ],
        mailbox=mailbox,
    )
    runner = create_team_runner(
        team, max_concurrent_work_items=2, emit=lambda e: seen.append(f"{e.type}:{getattr(e, 'subtype', '')}")
    )
    assert runner.options.max_concurrent_work_items == 2
    events = [e async for e in runner.query("go", stream=False)]
    assert events[-1].type == "result" and events[-1].result == "summary: R"
    assert "team_message:sent" in seen and "team_message:done" in seen and "team_agent:end" in seen

    def broken(event: Any) -> None:
        raise RuntimeError("observer bug")

    await team.lead.replace_history([])
    events = [e async for e in create_team_runner(team, emit=broken).query("again", stream=False)]
    assert (
        events[-1].subtype == "success" and events[-1].result == "summary: R"
    )  # a failing observer never fails the run
    assert [m.status for m in await mailbox.inbox("t16::m", "all")] == [
        MessageStatus.DONE,
        MessageStatus.DONE,
    ]
    with pytest.raises(ConfigError, match="bogus"):
        async for _ in team.query("go", bogus=True):
            pass
    with pytest.raises(ConfigError, match="runtime"):
        async for _ in team.query("go", runtime=object()):
            pass


async def test_abort_before_an_ask_runs_cancels_the_ask_message(mailbox: Any) -> None:
    from lattice_worker import AbortError, AbortSignal, ToolContext
    from lattice_worker.team import TeamRunner

    member_client = replying_client(lambda p: "x")
    team = create_team(
        name="t17",
        lead=create_agent(name="lead", model_client=ScriptedModelClient([])),
        members=[team_member(name="m", agent=create_agent(name="m", model_client=member_client))],
        mailbox=mailbox,
    )
    runner = TeamRunner(team, signal=AbortSignal.abort("stop"))
    message = await mailbox.send("t17::lead", "t17::m", "a question", work_item_id="wi_ask")
    with pytest.raises(AbortError):
        await runner.ask(team.member("m"), message, ToolContext(tool_use_id="toolu_1", tool_name="m"))
    assert member_client.requests == []
    assert (await mailbox.get(message.id)).status == MessageStatus.CANCELLED


async def test_closing_a_team_query_early_releases_the_lead_and_cancels_accepted_work(mailbox: Any) -> None:
    member_client = replying_client(lambda p: "x")
    lead_client = ScriptedModelClient(
        lambda r: (
            tool_turn(("m", {"mode": "handoff", "task": "t"})) if len(r.messages) == 1 else text_turn("fine")
        )
    )
    team = create_team(
        name="t18",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="m", agent=create_agent(name="m", model_client=member_client))],
        mailbox=mailbox,
    )
    stream = team.query("first", stream=False)
    async for event in stream:
        if event.type == "team_message" and event.subtype == "sent":
            break  # the consumer walks away while the handoff is accepted but not run
    await stream.aclose()
    assert [m.status for m in await mailbox.inbox("t18::m", "all")] == [MessageStatus.CANCELLED]
    assert member_client.requests == []
    await team.lead.replace_history([])
    assert (await team.prompt("second", stream=False)).result == "fine"  # the lead is free again


async def test_abort_while_a_member_model_call_hangs_cancels_it_and_the_queued_item(mailbox: Any) -> None:
    controller = AbortController()
    started = asyncio.Event()
    never = asyncio.Event()

    async def hanging(request: ModelRequest) -> AssistantModelMessage:
        started.set()
        await never.wait()  # a member that never replies
        return text_turn("unreachable")

    member_client = ScriptedModelClient(hanging)
    lead_client = ScriptedModelClient(
        [tool_turn(("m", {"mode": "handoff", "task": "one"}), ("m", {"mode": "handoff", "task": "two"}))]
    )
    team = create_team(
        name="t19",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="m", agent=create_agent(name="m", model_client=member_client))],
        mailbox=mailbox,
    )

    async def operator() -> None:
        await started.wait()
        controller.abort("operator stop")

    stopper = asyncio.create_task(operator())
    events = await asyncio.wait_for(collect(team, "go", stream=False, signal=controller.signal), timeout=30)
    await stopper
    assert events[-1].subtype == "error_abort" and "operator stop" in events[-1].error
    assert len(member_client.requests) == 1 and len(lead_client.requests) == 1
    assert [m.status for m in await mailbox.inbox("t19::m", "all")] == [
        MessageStatus.CANCELLED,
        MessageStatus.CANCELLED,
    ]
    cancelled = [e for e in events if e.type == "team_message" and e.subtype == "cancelled"]
    assert len(cancelled) == 2 and all(e.error["code"] == "aborted" for e in cancelled)
    assert await mailbox.inbox("t19::lead", "all") == []  # a cancelled item sends no report


async def test_a_member_raising_inside_prompt_is_one_failed_item_in_both_modes(mailbox: Any) -> None:
    class Exploding:
        def __init__(self) -> None:
            self.calls = 0

        async def prompt(self, text: str) -> str:
            self.calls += 1
            raise RuntimeError(f"exploded on {text}")

    host = Exploding()
    healthy = create_agent(name="ok", model_client=replying_client(lambda p: "fine"))
    lead_client = ScriptedModelClient(
        [
            tool_turn(
                ("boom", {"mode": "handoff", "task": "first"}),
                ("ok", {"mode": "handoff", "task": "second"}),
                ("boom", {"mode": "ask", "task": "third"}),
            ),
            lambda r: text_turn(json.dumps([(e["member"], e["status"]) for e in reports_of(r)])),
        ]
    )
    team = create_team(
        name="t20",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="boom", agent=host), team_member(name="ok", agent=healthy)],
        mailbox=mailbox,
    )
    result = await team.prompt("go", stream=False)
    assert host.calls == 2
    assert json.loads(result.result) == [["boom", "failed"], ["ok", "done"]]
    ask_block = lead_client.requests[1].messages[-1]["content"][2]  # results first, then the reports
    assert ask_block["is_error"] is True
    assert 'for member "boom" failed (runtime_error): exploded on third' in ask_block["content"]
    boxes = {m.content: m.status for m in await mailbox.inbox("t20::boom", "all")}
    assert boxes == {"first": MessageStatus.FAILED, "third": MessageStatus.FAILED}
    reports = [m for m in await mailbox.inbox("t20::lead", "all") if m.metadata.get("kind") == "failure"]
    assert sorted(m.metadata["error"]["message"] for m in reports) == [
        "exploded on first",
        "exploded on third",
    ]
    assert all(m.metadata["error"]["error_type"] == "RuntimeError" for m in reports)


async def test_a_mailbox_error_while_running_an_item_fails_that_item_only(mailbox: Any) -> None:
    real_claim = mailbox.claim_next
    broken_once = {"t21::a", "t21::b"}

    async def flaky_claim(box: str, *args: Any, **kwargs: Any) -> Any:
        if box in broken_once:  # fault injection on the real store: the first claim per box fails
            broken_once.discard(box)
            raise ConnectionError(f"store unreachable while claiming from {box}")
        return await real_claim(box, *args, **kwargs)

    mailbox.claim_next = flaky_claim
    lead_client = ScriptedModelClient(
        [
            tool_turn(
                ("a", {"mode": "handoff", "task": "ta"}),
                ("b", {"mode": "ask", "task": "tb"}),
                ("c", {"mode": "handoff", "task": "tc"}),
            ),
            lambda r: text_turn(json.dumps([(e["member"], e["status"]) for e in reports_of(r)])),
        ]
    )
    team = create_team(
        name="t21",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[
            team_member(name=n, agent=create_agent(name=n, model_client=replying_client(lambda p: "fine")))
            for n in ("a", "b", "c")
        ],
        mailbox=mailbox,
    )
    result = await team.prompt("go", stream=False)
    assert json.loads(result.result) == [["a", "failed"], ["c", "done"]]
    ask_block = lead_client.requests[1].messages[-1]["content"][1]  # results first, then the reports
    assert ask_block["is_error"] is True
    assert "store unreachable while claiming from t21::b" in ask_block["content"]
    for box, status in (("t21::a", MessageStatus.FAILED), ("t21::b", MessageStatus.FAILED)):
        (task,) = await mailbox.inbox(box, "all")
        assert task.status == status
        (report,) = [m for m in await mailbox.inbox("t21::lead", "all") if m.reply_to == task.id]
        assert report.metadata["kind"] == "failure"
        assert report.metadata["error"]["error_type"] == "ConnectionError"
    assert [m.status for m in await mailbox.inbox("t21::c", "all")] == [MessageStatus.DONE]
    for box in ("t21::a", "t21::b", "t21::c", "t21::lead"):
        assert await mailbox.inbox(box, "pending") == []


async def test_driving_the_lead_with_the_runner_as_runtime_then_cancel_pending(mailbox: Any) -> None:
    from lattice_worker import create_team_runner

    team, controller, member_client = handoff_then_abort_team("t22", mailbox)
    lead = team.lead
    runner = create_team_runner(team, signal=controller.signal)
    result = await lead.prompt("go", runtime=runner, signal=controller.signal, stream=False)
    assert result.subtype == "error_abort"
    assert [m.status for m in await mailbox.inbox("t22::m", "all")] == [MessageStatus.PENDING]
    await runner.cancel_pending("the host stopped the run")  # as create_team_runner documents
    assert [m.status for m in await mailbox.inbox("t22::m", "all")] == [MessageStatus.CANCELLED]
    assert member_client.requests == []
