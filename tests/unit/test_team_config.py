"""Team assembly, identifiers, reports, failure normalisation and the
agent-like surface of ``Team`` (in-memory mailbox, no services).

Creating a team, controlled handoff concurrency, nested teams, normalised
errors; docs/architecture.md, "Teams in one process".
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from lattice_mailbox import MemoryMailbox, MessageStatus, TeamMessage
from lattice_worker import (
    ConfigError,
    RunnerOptions,
    ScriptedModelClient,
    WorkItemOutcome,
    create_agent,
    create_team,
    create_team_runner,
    define_agent,
    team_member,
    text_turn,
    tool_turn,
)
from lattice_worker.agent.events import ResultMessage
from lattice_worker.errors import APIError, MaxTurnsError
from lattice_worker.team import (
    format_report_message,
    lead_mailbox_id,
    mailbox_id,
    new_work_item_id,
    parse_report_message,
)
from lattice_worker.team.events import failure_from_exception, failure_from_result
from lattice_worker.team.ids import split_mailbox_id


def agent(name: str = "x", turns: Any = ()) -> Any:
    # no workspace tools: these tests look at exactly the tools the team installs
    return create_agent(name=name, workspace=False, model_client=ScriptedModelClient(list(turns)))


# --------------------------------------------------------------------------- members and teams


@pytest.mark.parametrize("name", ["has space", "lead", "team_reply", "submit_output", "x" * 65, "", "a::b"])
def test_member_names_must_be_tool_names_and_not_reserved(name: str) -> None:
    with pytest.raises(ConfigError, match="team_member"):
        team_member(name=name, agent=agent())


def test_member_fields_are_checked() -> None:
    with pytest.raises(ConfigError, match="role must be a string"):
        team_member(name="m", agent=agent(), role=3)
    with pytest.raises(ConfigError, match="must be an Agent, an AgentSpec, a Team"):
        team_member(name="m", agent=42)
    with pytest.raises(ConfigError, match='unknown option "rank"'):
        team_member(name="m", agent=agent(), rank=1)
    member = team_member(
        name="m", agent=define_agent(name="d", model_client=ScriptedModelClient([])), role="r", focus="f"
    )
    assert member.kind == "spec" and member.accepts_tools and member.describe() == "m (r) -- f"


def test_duplicate_member_names_are_rejected_and_nothing_is_installed() -> None:
    lead = agent("lead")
    with pytest.raises(ConfigError, match='duplicate member name "worker"'):
        create_team(
            name="dup",
            lead=lead,
            members=[
                team_member(name="worker", agent=agent("a")),
                team_member(name="worker", agent=agent("b")),
            ],
        )
    assert lead.tools == []  # the lead got no tools from the failed assembly


def test_create_team_rejects_bad_input() -> None:
    lead = agent("lead")
    shared = agent("shared")
    good = [team_member(name="m", agent=agent("m"))]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "bad name", "lead": lead, "members": good}, "invalid name"),
        ({"name": "t", "lead": "not an agent", "members": good}, "lead must be an Agent"),
        ({"name": "t", "lead": lead, "members": [object()]}, "not a TeamMember"),
        (
            {"name": "t", "lead": lead, "members": [team_member(name="m", agent=lead)]},
            "is the lead agent itself",
        ),
        (
            {
                "name": "t",
                "lead": lead,
                "members": [team_member(name="a", agent=shared), team_member(name="b", agent=shared)],
            },
            'members "a" and "b" share one live session',
        ),
        ({"name": "t", "lead": lead, "members": good, "mailbox": object()}, "lacks send"),
        (
            {"name": "t", "lead": lead, "members": good, "runner": {"max_concurrent_work_items": 0}},
            "positive integer",
        ),
        (
            {"name": "t", "lead": lead, "members": good, "runner": {"max_concurrency": 2}},
            'unknown option "max_concurrency"',
        ),
        ({"name": "t", "lead": lead, "members": good, "expose_lead_mailbox_tools": "yes"}, "must be a bool"),
        ({"name": "t", "lead": lead, "members": good, "flavour": 1}, 'unknown option "flavour"'),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            create_team(**kwargs)
    assert lead.tools == []


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2", None])
def test_runner_options_need_a_positive_int(value: Any) -> None:
    with pytest.raises(ConfigError, match="max_concurrent_work_items must be a positive integer"):
        RunnerOptions(max_concurrent_work_items=value)


def test_create_team_defaults_and_lead_tools() -> None:
    lead = agent("lead")
    team = create_team(
        name="eng",
        lead=lead,
        members=[team_member(name="researcher", role="executor", focus="SDK", agent=agent("r"))],
    )
    assert isinstance(team.mailbox, MemoryMailbox)
    assert team.runner_options == RunnerOptions(max_concurrent_work_items=1)
    (member_tool,) = lead.tools
    assert member_tool.name == "researcher" and member_tool.kind == "agent_tool"
    assert member_tool.input_schema["required"] == ["mode", "task"]
    assert member_tool.input_schema["properties"]["mode"]["enum"] == ["ask", "handoff", "observe"]
    assert "executor" in member_tool.description and "SDK" in member_tool.description
    runner = create_team_runner(team, max_concurrent_work_items=3)
    assert runner.options.max_concurrent_work_items == 3
    with pytest.raises(ConfigError):
        create_team_runner(team, max_concurrent_work_items=0)
    with pytest.raises(ConfigError, match='no member "ghost"'):
        team.member("ghost")


def test_ids() -> None:
    assert mailbox_id("eng", "backend") == "eng::backend"
    assert lead_mailbox_id("eng") == "eng::lead"
    assert split_mailbox_id("eng::backend") == ("eng", "backend")
    with pytest.raises(ValueError):
        split_mailbox_id("no-separator")
    ids = {new_work_item_id() for _ in range(100)}
    assert len(ids) == 100 and all(i.startswith("wi_") for i in ids)


# --------------------------------------------------------------------------- reports and failures


def _message(member: str, n: int) -> TeamMessage:
    return TeamMessage(
        id=f"m{n}",
        from_="t::lead",
        to=f"t::{member}",
        content="task",
        created_at=1,
        thread_id=f"m{n}",
        work_item_id=f"wi{n}",
    )


def test_report_message_keeps_the_given_order_and_identifiers() -> None:
    outcomes = [
        WorkItemOutcome(message=_message("b", 1), status="done", content="B ok", structured_result={"k": 1}),
        WorkItemOutcome(
            message=_message("a", 2),
            status="failed",
            content="A failed",
            error={"code": "error_max_turns", "message": "too long", "error_type": "MaxTurnsError"},
        ),
    ]
    message = format_report_message(outcomes)
    assert message["role"] == "user"
    assert message["content"][0]["text"].startswith("Team handoff reports (2)")
    entries = parse_report_message(message)
    assert entries == [
        {"member": "b", "message_id": "m1", "work_item_id": "wi1", "thread_id": "m1", "status": "done",
         "content": "B ok", "structured_result": {"k": 1}},
        {"member": "a", "message_id": "m2", "work_item_id": "wi2", "thread_id": "m2", "status": "failed",
         "content": "A failed", "error": {"code": "error_max_turns", "message": "too long", "error_type": "MaxTurnsError"}},
    ]  # fmt: skip
    assert json.loads(message["content"][1]["text"])["member"] == "b"
    with pytest.raises(ValueError):
        format_report_message([])
    assert parse_report_message({"role": "user", "content": "hello"}) == []
    again = WorkItemOutcome.from_dict(json.loads(json.dumps(outcomes[1].to_dict())))
    assert again == outcomes[1]


def test_failures_are_normalised() -> None:
    def result(subtype: str, error: str, error_type: str | None) -> ResultMessage:
        return ResultMessage(
            subtype=subtype, is_error=True, session_id="s", error=error, error_type=error_type
        )

    assert failure_from_result(result("error_max_turns", "limit", "MaxTurnsError")) == {
        "code": "error_max_turns", "message": "limit", "error_type": "MaxTurnsError"}  # fmt: skip
    assert failure_from_result(result("error", "boom", "APIError"))["code"] == "api_error"
    assert failure_from_result(result("error_abort", "stop", "AbortError"))["code"] == "aborted"
    assert failure_from_result(result("error", "odd", "KeyError")) == {
        "code": "error",
        "message": "odd",
        "error_type": "KeyError",
    }
    assert failure_from_exception(MaxTurnsError("m"))["code"] == "error_max_turns"
    assert failure_from_exception(APIError("a"))["code"] == "api_error"
    assert failure_from_exception(RuntimeError("r")) == {
        "code": "runtime_error",
        "message": "r",
        "error_type": "RuntimeError",
    }


# --------------------------------------------------------------------------- agent-like surface


def test_team_prompt_sync_and_interrupt_when_idle() -> None:
    lead = create_agent(
        name="lead",
        model_client=ScriptedModelClient(
            [tool_turn(("m", {"mode": "ask", "task": "hi"})), text_turn("all good")]
        ),
    )
    member = create_agent(
        name="m", model_client=ScriptedModelClient([tool_turn(("team_reply", {"content": "hello"}))])
    )
    team = create_team(name="sync", lead=lead, members=[team_member(name="m", agent=member)])
    assert team.interrupt() is False
    result = team.prompt_sync("go", stream=False)
    assert result.result == "all good" and team.session_id == lead.session_id

    async def inside() -> None:
        with pytest.raises(RuntimeError, match="running event loop"):
            team.prompt_sync("go")

    asyncio.run(inside())


async def test_lead_queried_directly_gets_an_error_and_nothing_is_sent() -> None:
    client = ScriptedModelClient([tool_turn(("m", {"mode": "handoff", "task": "x"})), text_turn("ok")])
    lead = create_agent(name="lead", model_client=client)
    team = create_team(name="direct", lead=lead, members=[team_member(name="m", agent=agent("m"))])
    await lead.prompt("go", stream=False)
    block = client.requests[1].messages[-1]["content"][0]
    assert block["is_error"] and "needs a team runtime" in block["content"]
    assert await team.mailbox.inbox("direct::m", "all") == []


async def test_host_agent_like_member_final_text_becomes_the_reply() -> None:
    class Host:
        def __init__(self) -> None:
            self.prompts: list[str] = []

        async def prompt(self, text: str) -> dict[str, Any]:
            self.prompts.append(text)
            return {"result": f"host handled: {text}", "is_error": False}

    host = Host()
    lead_client = ScriptedModelClient(
        [tool_turn(("host", {"mode": "handoff", "task": "wash"})), text_turn("done")]
    )
    team = create_team(
        name="h",
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="host", agent=host)],
    )
    assert team.member("host").kind == "host" and not team.member("host").accepts_tools
    await team.prompt("go", stream=False)
    assert host.prompts == ["wash"]
    entry = parse_report_message(lead_client.requests[1].messages[-1])[0]
    assert entry["status"] == "done" and entry["content"] == "host handled: wash"
    task = (await team.mailbox.inbox("h::host", "all"))[0]
    assert task.status == MessageStatus.DONE
