"""Runs the tracer tests project: real Agents and Teams on a scripted model.

* :func:`run_tool_agent` -- agent ``calc`` (model ``m1``): turn 1 calls ``add``
  (succeeds, ``"3"``) and ``boom`` (raises ``RuntimeError("kaput")``) in one batch,
  with usage ``10 in / 3 out / 5 cache reads`` and response model ``m1-0501``;
  turn 2 answers ``"3"`` (``1 in / 1 out``).
* :func:`run_model_error_agent` -- agent ``flaky`` whose only model call raises
  ``APIError("overloaded")``.
* :func:`run_team` -- team ``crew``: lead ``boss`` hands one task to member
  ``worker``, who answers with ``team_reply``; the lead then sums up.
* :func:`run_split_across_processes` -- a team root traced by tracer ``a`` and a
  member run traced by tracer ``b`` (standing for another process): only the
  carrier dict of :func:`trace_carrier` crosses from one to the other.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from lattice_worker import (
    APIError,
    ModelRequest,
    ScriptedModelClient,
    create_agent,
    create_bare_agent,
    error_turn,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.team import create_team, team_member
from lattice_worker.tracing import TraceContext, TraceEmitter, trace_carrier

TOOL_PROMPT = "Add 1 and 2, and try boom."


class Pair(BaseModel):
    a: int
    b: int


def _add(args: Pair) -> str:
    return str(args.a + args.b)


def _boom(args: Pair) -> str:
    raise RuntimeError("kaput")


def tool_agent(tracer: Any) -> Any:
    return create_bare_agent(
        name="calc",
        model="m1",
        tracer=tracer,
        tools=[tool("add", "Adds two numbers.", Pair, _add), tool("boom", "Always fails.", Pair, _boom)],
        model_client=ScriptedModelClient(
            [
                tool_turn(
                    ("add", {"a": 1, "b": 2}, "call-add"),
                    ("boom", {"a": 0, "b": 0}, "call-boom"),
                    usage={"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 5},
                    model="m1-0501",
                    provider_response_id="msg-1",
                ),
                text_turn("3", usage={"input_tokens": 1, "output_tokens": 1}, model="m1-0501"),
            ]
        ),
    )


async def run_tool_agent(tracer: Any) -> Any:
    result = await tool_agent(tracer).prompt(TOOL_PROMPT)
    assert result.subtype == "success", result
    return result


async def run_model_error_agent(tracer: Any) -> Any:
    agent = create_bare_agent(
        name="flaky",
        model="m1",
        tracer=tracer,
        model_client=ScriptedModelClient([error_turn(APIError("overloaded", status_code=529))]),
    )
    result = await agent.prompt("hello")
    assert result.subtype == "error" and "overloaded" in (result.error or ""), result
    return result


def _replying_member() -> ScriptedModelClient:
    def play(request: ModelRequest) -> Any:
        last = request.messages[-1]["content"]
        if isinstance(last, list) and any(b.get("type") == "tool_result" for b in last):
            return text_turn("done")
        return tool_turn(("team_reply", {"content": "42 files"}))

    return ScriptedModelClient(play)


def team() -> Any:
    lead = create_agent(
        name="boss",
        model="m1",
        model_client=ScriptedModelClient(
            [tool_turn(("worker", {"mode": "handoff", "task": "count the files"})), text_turn("42")]
        ),
    )
    worker = create_agent(name="worker", model="m1", model_client=_replying_member())
    return create_team(name="crew", lead=lead, members=[team_member(name="worker", agent=worker)])


async def run_team(tracer: Any) -> list[Any]:
    events = [event async for event in team().query("How many files?", tracer=tracer, stream=False)]
    final = [e for e in events if e.type == "result"]
    assert final and final[-1].subtype == "success", final
    return events


async def run_split_across_processes(a: Any, b: Any) -> dict[str, str]:
    """Root run ``crew`` on ``a``; member run ``worker`` on ``b``, continued from the
    root's carrier (returned); the member ends, then the root."""
    root = TraceEmitter(a, TraceContext(session_id="s", source={"kind": "team", "name": "crew"}))
    await root.emit("run_start", {"team": "crew"})
    carrier = trace_carrier(a, root.run_id)
    member = TraceEmitter(
        b,
        TraceContext(
            session_id="s",
            source={"kind": "team_member", "name": "worker"},
            parent_run_id=root.run_id,
            remote_parent=carrier,
        ),
    )
    await member.emit("run_start", {"name": "worker"})
    await member.emit("result", {"subtype": "success", "is_error": False, "result": "ok"})
    await root.emit("result", {"subtype": "success", "is_error": False})
    return carrier
