"""permission_mode="by_effect": read_only tools run, every other call needs an
approval (the permission callback in process, the runtime's approve_tool_call,
else a denial naming the rule); a denial is an is_error result with the
reason; the default stays "every registered tool is allowed"
(docs/tool-effects.md)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from lattice_worker import (
    ConfigError,
    ScriptedModelClient,
    SuspendQuery,
    create_bare_agent,
    create_team,
    define_agent,
    team_member,
    text_turn,
    tool,
    tool_turn,
)


class Q(BaseModel):
    q: str = ""


class Ran:
    def __init__(self) -> None:
        self.names: list[str] = []

    def make(self, name: str, **options):
        def handler(_inp: Q) -> str:
            self.names.append(name)
            return f"{name} ok"

        return tool(name, f"The {name} tool.", Q, handler, **options)


def tools(ran: Ran):
    return [
        ran.make("search", effect="read_only"),
        ran.make("send_email"),
        ran.make("charge", effect="idempotent", dedup_window_s=60),
    ]


BATCH = tool_turn(("search", {}, "a"), ("send_email", {}, "b"), ("charge", {}, "c"))


async def blocks(agent, **options):
    result = await agent.prompt("go", stream=False, **options)
    history = await agent.get_history()
    return result, {b["tool_use_id"]: b for b in history[2]["content"]}


async def test_the_default_mode_allows_every_registered_tool():
    ran = Ran()
    agent = create_bare_agent(model_client=ScriptedModelClient([BATCH, text_turn("ok")]), tools=tools(ran))
    assert agent.options.permission_mode == "allow"
    _, out = await blocks(agent)
    assert ran.names == ["search", "send_email", "charge"]
    assert not any(b.get("is_error") for b in out.values())


async def test_by_effect_without_an_approver_runs_reads_and_denies_the_rest_naming_the_rule():
    ran = Ran()
    agent = create_bare_agent(
        model_client=ScriptedModelClient([BATCH, text_turn("ok")]),
        tools=tools(ran),
        permission_mode="by_effect",
    )
    result, out = await blocks(agent)
    assert result.subtype == "success"
    assert ran.names == ["search"]
    assert out["a"]["content"] == "search ok"
    for tid, effect in (("b", "unguarded"), ("c", "idempotent")):
        assert out[tid]["is_error"] is True
        assert 'permission_mode="by_effect"' in out[tid]["content"]
        assert f'effect is "{effect}"' in out[tid]["content"]


async def test_by_effect_asks_the_permission_callback_for_non_read_only_calls_only():
    ran = Ran()
    asked = []

    def permission(request):
        asked.append((request.tool_name, request.effect, request.effect_key))
        if request.tool_name == "send_email":
            return {"behavior": "deny", "message": "no emails on Sundays"}
        return {"behavior": "allow"}

    agent = create_bare_agent(
        model_client=ScriptedModelClient([BATCH, text_turn("ok")]),
        tools=tools(ran),
        permission_mode="by_effect",
        permission=permission,
    )
    _, out = await blocks(agent)
    assert [a[:2] for a in asked] == [("send_email", "unguarded"), ("charge", "idempotent")]
    assert asked[1][2] == f"{agent.session_id}:c"
    assert ran.names == ["search", "charge"]
    assert out["b"] == {
        "type": "tool_result",
        "tool_use_id": "b",
        "content": "no emails on Sundays",
        "is_error": True,
    }


async def test_by_effect_asks_the_runtimes_approver_after_the_callback():
    ran = Ran()
    order = []

    class Runtime:
        async def approve_tool_call(self, request):
            order.append(("runtime", request.tool_name))
            if request.tool_name == "charge":
                return {"behavior": "deny", "message": "denied by ops: over budget"}
            return {"behavior": "allow"}

    def permission(request):
        order.append(("callback", request.tool_name))
        return {"behavior": "allow"}

    agent = create_bare_agent(
        model_client=ScriptedModelClient([BATCH, text_turn("ok")]),
        tools=tools(ran),
        permission_mode="by_effect",
        permission=permission,
    )
    _, out = await blocks(agent, runtime=Runtime())
    assert order == [
        ("callback", "send_email"),
        ("runtime", "send_email"),
        ("callback", "charge"),
        ("runtime", "charge"),
    ]
    assert ran.names == ["search", "send_email"]
    assert out["c"]["is_error"] is True and out["c"]["content"] == "denied by ops: over budget"

    # the runtime alone is enough; a malformed or raising approver denies (fail closed)
    class Odd:
        def approve_tool_call(self, request):
            if request.tool_name == "charge":
                raise RuntimeError("store down")
            return "yes"

    ran2 = Ran()
    agent = create_bare_agent(
        model_client=ScriptedModelClient([BATCH, text_turn("ok")]),
        tools=tools(ran2),
        permission_mode="by_effect",
    )
    _, out = await blocks(agent, runtime=Odd())
    assert ran2.names == ["search"]
    assert "returned 'yes'" in out["b"]["content"]
    assert "RuntimeError: store down" in out["c"]["content"]


async def test_an_approver_that_suspends_stops_the_query_with_the_assistant_turn_last():
    ran = Ran()

    class Waiting:
        def __init__(self) -> None:
            self.decisions: dict[str, dict] = {}
            self.pending: list[str] = []

        async def approve_tool_call(self, request):
            decision = self.decisions.get(request.tool_use_id)
            if decision is None:
                self.pending.append(request.tool_use_id)
                raise SuspendQuery("waiting for an approval")
            return decision

    runtime = Waiting()
    turn = tool_turn(("search", {}, "a"), ("send_email", {}, "b"), ("search", {"q": "2"}, "d"))
    client = ScriptedModelClient([turn, turn, text_turn("sent")])
    agent = create_bare_agent(model_client=client, tools=tools(ran), permission_mode="by_effect")
    result = await agent.prompt("go", stream=False, runtime=runtime)
    assert result.subtype == "suspended" and result.is_error is False
    assert runtime.pending == ["b"]
    assert ran.names == ["search"]  # the call after the waiting one did not start
    history = await agent.get_history()
    assert history[-1]["role"] == "assistant"  # no tool_result recorded for the stopped batch

    # the person approves; the runtime replays the turn (as the distributed runtime does)
    runtime.decisions["b"] = {"behavior": "allow"}
    await agent.replace_history(history[:-1])
    result = await agent.prompt("go on", stream=False, runtime=runtime)
    assert result.subtype == "success" and result.result == "sent"
    assert ran.names == ["search", "search", "send_email", "search"]


async def test_runtime_tools_need_no_approval():
    worker = define_agent(
        model_client=ScriptedModelClient(
            lambda request: tool_turn(("team_reply", {"content": "done"}))(request)
        ),
        permission_mode="by_effect",
        workspace=False,
    )
    lead_turns = [tool_turn(("worker", {"mode": "ask", "task": "do it"})), text_turn("all done")]
    lead = define_agent(
        model_client=ScriptedModelClient(lead_turns), permission_mode="by_effect", workspace=False
    )
    team = create_team(name="t", lead=lead, members=[team_member(name="worker", agent=worker)])
    result = await team.prompt("go", stream=False)
    assert result.subtype == "success" and result.result == "all done"


def test_permission_mode_is_validated():
    with pytest.raises(ConfigError, match='option "permission_mode" expects "allow"'):
        create_bare_agent(permission_mode="ask")
