"""Nested teams, manual draining, and agent_tool over a team.

Nested teams keep one trace session; ``agent_tool`` takes any agent-like
target, a team included.
Every test runs against MemoryMailbox and RedisMailbox (real Redis, unique
prefix, keys deleted after).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from lattice_mailbox import MessageStatus
from lattice_worker import (
    AssistantModelMessage,
    ConfigError,
    ModelRequest,
    ScriptedModelClient,
    agent_tool,
    create_agent,
    define_agent,
    text_turn,
    tool_turn,
)
from lattice_worker.team import create_team, parse_report_message, team_member
from lattice_worker.tracing.base import define_context_tracer


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def reports_of(request: ModelRequest) -> list[dict[str, Any]]:
    for message in reversed(request.messages):
        entries = parse_report_message(message)
        if entries:
            return entries
    return []


def relaying_lead(member: str, task: str, prefix: str) -> ScriptedModelClient:
    """Hands ``task`` off to ``member``, then answers ``prefix`` + the member's report."""

    def play(request: ModelRequest) -> AssistantModelMessage:
        entries = reports_of(request)
        if not entries:
            return tool_turn((member, {"mode": "handoff", "task": task}))
        return text_turn(prefix + entries[0]["content"])

    return ScriptedModelClient(play)


def echo_member(tag: str) -> ScriptedModelClient:
    """Replies ``<tag>:<first line of the task>`` -- so a test can see which member ran which message."""

    def play(request: ModelRequest) -> AssistantModelMessage:
        prompt = _text(request.messages[0]["content"])
        task = prompt.split(":\n\n", 1)[1].split("\n\n")[0]
        return tool_turn(("team_reply", {"content": f"{tag}:{task}"}))

    return ScriptedModelClient(play)


async def test_three_level_nested_team_returns_the_backend_answer_to_the_root(mailbox: Any) -> None:
    traced: list[dict[str, Any]] = []
    backend = create_agent(
        name="backend",
        model_client=ScriptedModelClient(
            lambda r: tool_turn(("team_reply", {"content": "the API listens on 8080"}))
        ),
    )
    engineering = create_team(
        name="engineering",
        lead=create_agent(
            name="eng-head", model_client=relaying_lead("backend", "find the API port", "engineering: ")
        ),
        members=[team_member(name="backend", role="executor", agent=backend)],
        mailbox=mailbox,
    )
    company = create_team(
        name="company",
        lead=create_agent(
            name="ceo", model_client=relaying_lead("engineering", "which port does the API use?", "CEO: ")
        ),
        members=[
            team_member(name="engineering", role="head", focus="Own engineering delivery", agent=engineering)
        ],
        mailbox=mailbox,
    )
    events = [
        e
        async for e in company.query(
            "status report", stream=False, tracer=define_context_tracer(on_event=traced.append)
        )
    ]
    final = events[-1]
    assert final.type == "result" and final.subtype == "success"
    assert final.result == "CEO: engineering: the API listens on 8080"

    company_task = (await mailbox.inbox("company::engineering", "all"))[0]
    backend_task = (await mailbox.inbox("engineering::backend", "all"))[0]
    assert company_task.status == backend_task.status == MessageStatus.DONE
    assert backend_task.content == "find the API port"
    assert company_task.content == "which port does the API use?"

    # the engineering team's own events arrive nested inside agent_message events
    nested = [e.message for e in events if e.type == "agent_message" and e.member == "engineering"]
    inner_team = [m for m in nested if m["type"] == "team_message"]
    assert [m["subtype"] for m in inner_team] == ["sent", "claimed", "reply", "done"]
    assert inner_team[0]["team"] == "engineering"
    deepest = [m["message"]["type"] for m in nested if m["type"] == "agent_message"]
    assert deepest[0] == "system" and deepest[-1] == "result"

    assert len({e["session_id"] for e in traced}) == 1
    backend_events = [e for e in traced if e["source"].get("mailbox") == "engineering::backend"]
    assert backend_events and all(e["agent_session_id"] == backend.session_id for e in backend_events)
    eng_root = [
        e for e in traced if e["source"].get("mailbox") == "company::engineering" and e["type"] == "run_start"
    ]
    assert len(eng_root) == 1


async def test_drain_honours_max_rounds_and_max_messages_and_never_reroutes(mailbox: Any) -> None:
    a_client, b_client = echo_member("A"), echo_member("B")
    team = create_team(
        name="dr1",
        lead=create_agent(name="lead", model_client=ScriptedModelClient([])),
        members=[
            team_member(name="a", agent=define_agent(name="a", model_client=a_client)),
            team_member(name="b", agent=define_agent(name="b", model_client=b_client)),
        ],
        mailbox=mailbox,
    )
    for i in range(3):
        await mailbox.send("dr1::lead", "dr1::a", f"a{i}", work_item_id=f"wi_a{i}")
    for i in range(2):
        await mailbox.send("dr1::lead", "dr1::b", f"b{i}", work_item_id=f"wi_b{i}")

    first = await team.drain(max_rounds=2, max_messages=10)
    assert (first.processed, first.failed, first.rounds) == (4, 0, 2)
    assert [m.content for m in await mailbox.inbox("dr1::a", "pending")] == ["a2"]
    assert await mailbox.inbox("dr1::b", "pending") == []

    await mailbox.send("dr1::lead", "dr1::b", "b2")
    await mailbox.send("dr1::lead", "dr1::b", "b3")
    second = await team.drain(max_rounds=10, max_messages=2)
    assert (second.processed, second.failed, second.rounds) == (2, 0, 1)
    assert [m.content for m in await mailbox.inbox("dr1::b", "pending")] == ["b3"]

    third = await team.drain()
    assert (third.processed, third.failed, third.rounds) == (1, 0, 1)
    empty = await team.drain()
    assert (empty.processed, empty.failed, empty.rounds) == (0, 0, 0)

    replies = await mailbox.inbox("dr1::lead", "all")
    by_member = sorted((m.from_, m.content) for m in replies)
    assert by_member == [
        ("dr1::a", "A:a0"), ("dr1::a", "A:a1"), ("dr1::a", "A:a2"),
        ("dr1::b", "B:b0"), ("dr1::b", "B:b1"), ("dr1::b", "B:b2"), ("dr1::b", "B:b3"),
    ]  # fmt: skip
    assert all(m.metadata["kind"] == "reply" and m.status == MessageStatus.PENDING for m in replies)
    assert len(a_client.requests) == 3 and len(b_client.requests) == 4


async def test_drain_of_selected_members_counts_failures_and_rejects_bad_limits(mailbox: Any) -> None:
    silent = define_agent(name="silent", model_client=ScriptedModelClient(lambda r: text_turn("hmm")))
    team = create_team(
        name="dr2",
        lead=create_agent(name="lead", model_client=ScriptedModelClient([])),
        members=[
            team_member(name="ok", agent=define_agent(name="ok", model_client=echo_member("OK"))),
            team_member(name="silent", agent=silent),
        ],
        mailbox=mailbox,
    )
    await mailbox.send("dr2::lead", "dr2::ok", "x")
    await mailbox.send("dr2::lead", "dr2::silent", "y")

    bad: list[tuple[dict[str, Any], str]] = [
        ({"max_rounds": 0}, "max_rounds must be a positive integer, got 0"),
        ({"max_rounds": -3}, "max_rounds must be a positive integer, got -3"),
        ({"max_rounds": 1.5}, "max_rounds must be a positive integer, got 1.5"),
        ({"max_messages": True}, "max_messages must be a positive integer, got True"),
        ({"max_messages": "5"}, "max_messages must be a positive integer, got '5'"),
        ({"max_messages": None}, "max_messages must be a positive integer, got None"),
        ({"members": ["nobody"]}, 'no member "nobody"'),
        ({"members": 5}, "members must be a member name or a list of names"),
        ({"members": ["ok", 7]}, "members must be member names"),
        ({"max_round": 3}, 'unknown option "max_round"'),
    ]
    for kwargs, message in bad:
        with pytest.raises(ConfigError, match=re.escape(message)):
            await team.drain(**kwargs)
    # bad input claimed nothing
    assert [m.status for m in await mailbox.inbox("dr2::ok", "all")] == [MessageStatus.PENDING]
    assert [m.status for m in await mailbox.inbox("dr2::silent", "all")] == [MessageStatus.PENDING]

    only_silent = await team.drain(members=["silent"])
    assert (only_silent.processed, only_silent.failed, only_silent.rounds) == (1, 1, 1)
    assert len(await mailbox.inbox("dr2::ok", "pending")) == 1
    failed = (await mailbox.inbox("dr2::silent", "all"))[0]
    assert failed.status == MessageStatus.FAILED
    diagnostic = [m for m in await mailbox.inbox("dr2::lead", "all") if m.reply_to == failed.id][0]
    assert diagnostic.metadata["kind"] == "diagnostic" and diagnostic.metadata["error"]["code"] == "no_reply"

    rest = await team.drain()
    assert (rest.processed, rest.failed) == (1, 0)


async def test_agent_tool_over_a_team_asks_the_whole_team(mailbox: Any) -> None:
    backend = create_agent(
        name="backend",
        model_client=ScriptedModelClient(lambda r: tool_turn(("team_reply", {"content": "42"}))),
    )
    team = create_team(
        name="eng",
        lead=create_agent(name="head", model_client=relaying_lead("backend", "compute", "team says ")),
        members=[team_member(name="backend", agent=backend)],
        mailbox=mailbox,
    )
    tool_def = agent_tool("engineering", team, description="Ask the engineering team.")
    assert tool_def.kind == "agent_tool"
    assert "keeps its conversation across calls" in tool_def.description
    supervisor_client = ScriptedModelClient(
        [
            tool_turn(("engineering", {"mode": "ask", "task": "what is the answer?"})),
            lambda r: text_turn("supervisor heard: " + r.messages[-1]["content"][0]["content"]),
        ]
    )
    supervisor = create_agent(name="sup", model_client=supervisor_client, tools=[tool_def])
    result = await supervisor.prompt("go", stream=False)
    assert result.result == "supervisor heard: team says 42"
    assert (await mailbox.inbox("eng::backend", "all"))[0].status == MessageStatus.DONE
    assert (
        json.dumps(supervisor_client.requests[0].tools[0]["input_schema"]["required"]) == '["mode", "task"]'
    )


def status_lead(member: str, task: str, prefix: str) -> ScriptedModelClient:
    """Hands ``task`` off to ``member``, then answers ``prefix`` + ``status/error code`` of its report."""

    def play(request: ModelRequest) -> AssistantModelMessage:
        entries = reports_of(request)
        if not entries:
            return tool_turn((member, {"mode": "handoff", "task": task}))
        entry = entries[0]
        return text_turn(f"{prefix}{entry['status']}/{(entry.get('error') or {}).get('code')}")

    return ScriptedModelClient(play)


async def test_nested_team_failures_stay_isolated_and_reach_the_root_as_reports(mailbox: Any) -> None:
    from lattice_worker import APIError, tool

    @tool(name="dig", description="Dig.")
    def dig() -> str:
        return "deeper"

    # 1. the inner member fails: the inner lead gets the failure report, decides, and its
    #    answer is the (successful) reply of the inner team to the root
    backend = create_agent(
        name="backend",
        model_client=ScriptedModelClient(lambda r: tool_turn(("dig", {}))),
        tools=[dig],
        max_turns=2,
    )
    engineering = create_team(
        name="eng1",
        lead=create_agent(name="head", model_client=status_lead("backend", "build", "backend was ")),
        members=[team_member(name="backend", agent=backend)],
        mailbox=mailbox,
    )
    company = create_team(
        name="co1",
        lead=create_agent(name="ceo", model_client=relaying_lead("engineering", "ship it", "CEO heard: ")),
        members=[team_member(name="engineering", agent=engineering)],
        mailbox=mailbox,
    )
    result = await company.prompt("go", stream=False)
    assert result.subtype == "success"
    assert result.result == "CEO heard: backend was failed/error_max_turns"
    assert [m.status for m in await mailbox.inbox("eng1::backend", "all")] == [MessageStatus.FAILED]
    assert [m.status for m in await mailbox.inbox("co1::engineering", "all")] == [MessageStatus.DONE]

    # 2. the inner lead itself fails: the root's work item for the inner team fails with the
    #    normalised error, a failure report goes upstream, and the root lead is resumed
    inner_lead = ScriptedModelClient(
        [
            tool_turn(("backend", {"mode": "handoff", "task": "build"})),
            APIError("head is down", status_code=500),
        ]
    )
    ok_backend = create_agent(
        name="backend2",
        model_client=ScriptedModelClient(lambda r: tool_turn(("team_reply", {"content": "built"}))),
    )
    engineering2 = create_team(
        name="eng2",
        lead=create_agent(name="head2", model_client=inner_lead),
        members=[team_member(name="backend", agent=ok_backend)],
        mailbox=mailbox,
    )
    company2 = create_team(
        name="co2",
        lead=create_agent(
            name="ceo2", model_client=status_lead("engineering", "ship it", "engineering was ")
        ),
        members=[team_member(name="engineering", agent=engineering2)],
        mailbox=mailbox,
    )
    result = await company2.prompt("go", stream=False)
    assert result.subtype == "success" and result.result == "engineering was failed/api_error"
    (task,) = await mailbox.inbox("co2::engineering", "all")
    assert task.status == MessageStatus.FAILED
    (report,) = [m for m in await mailbox.inbox("co2::lead", "all") if m.reply_to == task.id]
    assert report.metadata["kind"] == "failure"
    assert report.metadata["error"] == {
        "code": "api_error",
        "message": "head is down",
        "error_type": "APIError",
    }
    assert [m.status for m in await mailbox.inbox("eng2::backend", "all")] == [MessageStatus.DONE]
    for box in ("co2::engineering", "eng2::backend", "co2::lead", "eng2::lead"):
        assert await mailbox.inbox(box, "pending") == []
