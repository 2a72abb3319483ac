"""What a team's caller learns (in one process, MemoryMailbox): the team result names the
member and the work item of a member that ended without ``team_reply``; the reports are
readable with the public ``parse_report_message``; a plain function is a model client."""

from __future__ import annotations

import pytest

import lattice_worker
from lattice_worker import (
    AssistantModelMessage,
    ConfigError,
    ModelRequest,
    ScriptedModelClient,
    TeamResultMessage,
    create_agent,
    create_team,
    define_agent,
    failed_work_items,
    parse_report_message,
    team_member,
)


def _tool_use(name: str, payload: dict, tool_use_id: str) -> dict:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": payload}


def _text(text: str) -> AssistantModelMessage:
    return AssistantModelMessage(content=[{"type": "text", "text": text}], stop_reason="end_turn")


def lead(request: ModelRequest) -> AssistantModelMessage:
    """First turn: hand off to writer and ask checker in one batch; then answer."""
    if len(request.messages) == 1:
        return AssistantModelMessage(
            content=[
                _tool_use("writer", {"mode": "handoff", "task": "write it"}, "toolu_w"),
                _tool_use("checker", {"mode": "ask", "task": "check it"}, "toolu_c"),
            ],
            stop_reason="tool_use",
        )
    return _text("all done")


def writer(request: ModelRequest) -> AssistantModelMessage:
    """Answers in plain text and never calls team_reply: its work item fails."""
    return _text("I wrote it")


def checker(request: ModelRequest) -> AssistantModelMessage:
    if len(request.messages) == 1:
        return AssistantModelMessage(
            content=[_tool_use("team_reply", {"content": "checked"}, "toolu_r")], stop_reason="tool_use"
        )
    return _text("")


def build(checker_model=checker):
    return create_team(
        name="help",
        lead=define_agent(name="lead", model_client=lead),  # plain functions as models
        members=[
            team_member(name="writer", agent=define_agent(name="writer", model_client=writer)),
            team_member(name="checker", agent=define_agent(name="checker", model_client=checker_model)),
        ],
    )


def test_a_member_without_team_reply_is_named_in_the_team_result():
    team = build()
    result = team.prompt_sync("go")
    assert isinstance(result, TeamResultMessage)
    assert (result.subtype, result.result) == ("success", "all done")  # the lead decided
    assert [(e["member"], e["status"]) for e in result.work_items] == [
        ("writer", "failed"),
        ("checker", "done"),
    ]
    [failed] = result.failed_work_items
    assert failed["member"] == "writer" and failed["error"]["code"] == "no_reply"
    assert "without calling team_reply" in failed["error"]["message"]
    assert "I wrote it" in failed["error"]["message"]  # the member's last text, to see what it did
    assert failed["work_item_id"] == result.work_items[0]["work_item_id"] and failed["work_item_id"]
    assert result.model_dump()["failed_work_items"] == [failed]


def test_a_failed_ask_is_named_too():
    team = build(checker_model=writer)  # checker does not reply either
    result = team.prompt_sync("go")
    assert sorted(e["member"] for e in result.failed_work_items) == ["checker", "writer"]
    assert {e["error"]["code"] for e in result.failed_work_items} == {"no_reply"}


async def test_reports_in_the_lead_history_are_readable_with_public_helpers():
    team = build(checker_model=writer)
    result = await team.prompt("go")
    history = await team.lead.get_history()
    entries = [e for m in history for e in parse_report_message(m)]
    assert [(e["member"], e["status"]) for e in entries] == [("writer", "failed")]  # the handoff report
    assert entries[0]["work_item_id"] == result.work_items[0]["work_item_id"]
    # the same failures, read back from the history (what the distributed runtime does)
    from_history = failed_work_items(history)  # history order: the ask's tool result, then the report
    assert sorted((e["member"], e["work_item_id"], e["error"]["code"]) for e in from_history) == sorted(
        (e["member"], e["work_item_id"], e["error"]["code"]) for e in result.failed_work_items
    )
    assert parse_report_message({"role": "user", "content": "hi"}) == []
    assert "parse_report_message" in lattice_worker.__all__ and "TeamResultMessage" in lattice_worker.__all__


def test_a_plain_function_or_coroutine_function_is_a_model_client():
    async def model(request: ModelRequest) -> AssistantModelMessage:
        return _text(f"seen {len(request.messages)} message(s)")

    agent = create_agent(model_client=model)
    assert isinstance(agent.options.model_client, ScriptedModelClient)
    assert agent.prompt_sync("hi").result == "seen 1 message(s)"
    spec = define_agent(model_client=lambda request: _text("from a lambda"))
    assert spec.spawn().prompt_sync("x").result == "from a lambda"
    assert spec.spawn().prompt_sync("y").result == "from a lambda"  # stateless: every session, every turn


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (ScriptedModelClient, "ScriptedModelClient is a class: pass an instance"),
        (42, "no create_message method"),
    ],
)
def test_a_model_client_that_is_neither_says_how_to_pass_one(value, words):
    with pytest.raises(ConfigError) as caught:
        create_agent(model_client=value)
    message = str(caught.value)
    assert words in message and "function(request) returning an AssistantModelMessage" in message
