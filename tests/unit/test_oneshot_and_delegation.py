"""The one-shot ``query()`` helper, ``delegate_tool`` and the delegation depth limit
(``RunnerOptions.max_delegate_depth``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lattice_worker import (
    DEFAULT_MAX_DELEGATE_DEPTH,
    AssistantModelMessage,
    ConfigError,
    ModelRequest,
    RunnerOptions,
    ScriptedModelClient,
    agent_tool,
    create_agent,
    create_team,
    define_agent,
    delegate_tool,
    query,
    team_member,
    text_turn,
    tool_turn,
)
from lattice_worker.team import parse_report_message
from lattice_worker.team.runner import create_team_runner


def last_tool_result(request: ModelRequest) -> dict[str, Any] | None:
    content = request.messages[-1]["content"]
    if isinstance(content, list) and content and content[-1].get("type") == "tool_result":
        return content[-1]
    return None


# ------------------------------------------------------------------------------ query()


async def test_query_runs_one_prompt_on_a_fresh_agent():
    client = ScriptedModelClient([text_turn("four", usage={"input_tokens": 3, "output_tokens": 1})])
    events = [
        e
        async for e in query("2+2?", model_client=client, model="m", system_prompt="Be brief.", stream=False)
    ]
    assert [e.type for e in events] == ["system", "assistant", "result"]
    assert events[-1].result == "four" and events[-1].usage["input_tokens"] == 3
    [request] = client.requests
    assert request.model == "m" and request.messages == [{"role": "user", "content": "2+2?"}]
    assert request.system.startswith("Be brief.") and request.stream is False


async def test_query_takes_options_both_accept_and_refuses_bad_ones_at_once():
    client = ScriptedModelClient([text_turn("ok")])
    events = [
        e
        async for e in query(
            "x", model_client=client, thinking_config={"type": "enabled", "budget_tokens": 2048}, stream=False
        )
    ]
    assert events[-1].result == "ok" and client.requests[0].thinking == {
        "type": "enabled",
        "budget_tokens": 2048,
    }
    with pytest.raises(ConfigError, match='query: unknown option "bogus"'):
        query("x", bogus=1)
    with pytest.raises(ConfigError, match='query: option "max_turns"'):
        query("x", max_turns=0)
    with pytest.raises(ConfigError, match='query: option "stream"'):
        query("x", stream="yes")
    with pytest.raises(ConfigError, match="prompt"):
        query(None)
    with pytest.raises(ConfigError, match="empty"):
        query("   ")


# ------------------------------------------------------------------------------ delegate_tool


async def test_delegate_tool_runs_the_agent_and_returns_its_answer():
    child = define_agent(
        name="explorer", model_client=ScriptedModelClient(lambda r: text_turn("found 3 files"))
    )
    tool = delegate_tool("explore", "Inspect the repository and report findings.", child)
    assert tool.name == "explore" and tool.kind == "agent_tool"
    assert tool.description.startswith("Inspect the repository and report findings.")
    lead_client = ScriptedModelClient(
        [tool_turn(("explore", {"mode": "ask", "task": "look"})), text_turn("done")]
    )
    result = await create_agent(model_client=lead_client, tools=[tool]).prompt("go", stream=False)
    assert result.result == "done"
    assert last_tool_result(lead_client.requests[1])["content"] == "found 3 files"


def test_delegate_tool_validates_like_agent_tool_with_its_own_prefix():
    child = define_agent(model_client=ScriptedModelClient([]))
    with pytest.raises(ConfigError, match=r'^delegate_tool\("x"\): unknown option "mode"'):
        delegate_tool("x", "d", child, mode="ask")
    with pytest.raises(ConfigError, match=r'^delegate_tool\("x"\): description must be a non-empty string'):
        delegate_tool("x", "  ", child)
    with pytest.raises(ConfigError, match=r"^delegate_tool\(\"bad name\"\): invalid name"):
        delegate_tool("bad name", "d", child)
    with pytest.raises(ConfigError, match=r'^delegate_tool\("x"\): target must be'):
        delegate_tool("x", "d", 42)


# ------------------------------------------------------------------------------ depth


CALLS: dict[str, list[int]] = {}


def chain_level(level: int, next_tool: Any) -> Any:
    """An agent spec that delegates once to ``next_tool`` (if any), then answers with
    ``L<level>(<what it got back>)``; the last one answers ``bottom``. Its model calls
    are recorded in ``CALLS["level<n>"]``."""
    calls = CALLS.setdefault(f"level{level}", [])
    calls.clear()

    def play(request: ModelRequest) -> AssistantModelMessage:
        calls.append(level)
        if next_tool is None:
            return text_turn("bottom")
        result = last_tool_result(request)
        if result is None:
            return tool_turn(("deeper", {"mode": "ask", "task": "go deeper"}))
        return text_turn(f"L{level}({result['content']})")

    return define_agent(
        name=f"level{level}",
        model_client=ScriptedModelClient(play),
        tools=[next_tool] if next_tool is not None else [],
    )


async def test_nested_delegation_beyond_the_default_depth_is_refused_with_a_tool_error():
    assert DEFAULT_MAX_DELEGATE_DEPTH == 3
    level = chain_level(5, None)
    for n in (4, 3, 2, 1):
        level = chain_level(n, delegate_tool("deeper", f"Ask level {n + 1}.", level))
    root = create_agent(
        model_client=ScriptedModelClient(
            [
                tool_turn(("deeper", {"mode": "ask", "task": "start"})),
                lambda r: text_turn(last_tool_result(r)["content"]),
            ]
        ),
        tools=[delegate_tool("deeper", "Ask level 1.", level)],
    )
    result = await root.prompt("go", stream=False)
    # root (0) -> level1 (1) -> level2 (2) -> level3 (3) -> level4 would be depth 4: refused
    assert result.result.startswith(
        'L1(L2(L3(Error: delegate_tool("deeper"): refused -- delegation depth limit'
    )
    assert "delegation depth 4, beyond max_delegate_depth=3" in result.result
    assert CALLS["level4"] == [] and CALLS["level5"] == []  # never run
    assert CALLS["level3"] == [3, 3] and CALLS["level1"] == [1, 1]


def member_with_helper(helper_tool: Any) -> Any:
    """A live member that asks its helper, then team_reply's with what it got."""

    def play(request: ModelRequest) -> AssistantModelMessage:
        result = last_tool_result(request)
        if result is None:
            return tool_turn(("helper", {"mode": "ask", "task": "help"}))
        if result["tool_use_id"].startswith("reply"):
            return text_turn("replied")
        return tool_turn(("team_reply", {"content": str(result["content"])}, "reply-1"))

    return create_agent(name="member", model_client=ScriptedModelClient(play), tools=[helper_tool])


def handing_off_team(name: str, helper_tool: Any, runner: Any = None) -> Any:
    """A lead that hands one task to ``member`` (a :func:`member_with_helper` asking
    ``helper_tool``) and answers with the report's JSON."""
    lead_client = ScriptedModelClient(
        [
            tool_turn(("member", {"mode": "handoff", "task": "do it"})),
            lambda r: text_turn(json.dumps(parse_report_message(r.messages[-1]))),
        ]
    )
    return create_team(
        name=name,
        lead=create_agent(name="lead", model_client=lead_client),
        members=[team_member(name="member", agent=member_with_helper(helper_tool))],
        runner=runner,
    )


@pytest.mark.parametrize(
    ("runner", "expected"),
    [
        (None, "helped"),
        (RunnerOptions(max_delegate_depth=2), "helped"),
        ({"max_delegate_depth": 1}, "refused -- delegation depth limit reached"),
    ],
)
async def test_a_team_runner_limits_delegation_depth_inside_member_runs(runner, expected):
    helper_calls: list[str] = []

    def helper_play(request: ModelRequest) -> AssistantModelMessage:
        helper_calls.append("x")
        return text_turn("helped")

    helper = define_agent(name="helper", model_client=ScriptedModelClient(helper_play))
    team = handing_off_team("depth", agent_tool("helper", helper), runner)
    result = await team.prompt("go", stream=False)
    [report] = json.loads(result.result)
    assert report["status"] == "done" and expected in report["content"]
    assert helper_calls == ([] if "refused" in expected else ["x"])
    if "refused" in expected:
        assert "delegation depth 2, beyond max_delegate_depth=1" in report["content"]
    [task] = [m for m in await team.mailbox.inbox("depth::member", "all")]
    assert task.metadata["delegate_depth"] == 1


@pytest.mark.parametrize(
    ("override", "expected"), [(5, "L1(L2(bottom))"), (2, "depth 3, beyond max_delegate_depth=2")]
)
async def test_a_team_runners_max_delegate_depth_overrides_the_teams_inside_member_runs(override, expected):
    # the team keeps the default (3); its runner says otherwise, for the lead and its members alike:
    # member (1) -> level1 (2) -> level2 (3) -> level3 (4)
    level = chain_level(3, None)
    for n in (2, 1):
        level = chain_level(n, delegate_tool("deeper", f"Ask level {n + 1}.", level))
    team = handing_off_team("override", delegate_tool("helper", "Ask.", level))
    events = [
        e async for e in create_team_runner(team, max_delegate_depth=override).query("go", stream=False)
    ]
    [report] = json.loads(events[-1].result)
    assert expected in report["content"]
    [task] = await team.mailbox.inbox("override::member", "all")
    assert (task.metadata["delegate_depth"], task.metadata["delegate_limit"]) == (1, override)


@pytest.mark.parametrize("bad", [0, -1, True, "2"])
def test_max_delegate_depth_is_validated(bad):
    with pytest.raises(ConfigError, match="max_delegate_depth must be a positive integer"):
        RunnerOptions(max_delegate_depth=bad)
    with pytest.raises(ConfigError, match="max_delegate_depth"):
        create_team(
            name="t",
            lead=create_agent(model_client=ScriptedModelClient([])),
            members=[team_member(name="m", agent=create_agent(model_client=ScriptedModelClient([])))],
            runner={"max_delegate_depth": bad},
        )
