"""A team for the token-budget tests (issue 22): every model call reports the
same usage, so a run's spend is a known sum whatever worker runs which step.

Team "e2e_budget": the lead asks member ``worker`` ``N`` times one after
another (``N`` = the prompt, an int), then answers ``"final: "`` + the
answers. Each lead call and each member call reports
:data:`CALL_USAGE` (input + output = :data:`CALL_TOKENS`). A member item
takes two calls (its ``jot`` tool, then ``team_reply``, which ends its turn). So a run of ``N`` asks
spends ``(N + 1 + 2 * N) * CALL_TOKENS`` tokens, one call after another.

Team "e2e_budget_parallel": the lead asks ``worker`` ``N`` times at once
(``N`` tool calls in its first turn: ``N`` work items in flight together),
then answers; its member's calls take a moment (:data:`MEMBER_CALL_SECONDS`),
so the items' calls overlap. A run spends :func:`parallel_run_tokens`.

Agents are bare (``workspace=False``: no built-in tools, no workspace
directory). Models are stateless callables of the request (docs/testing.md): a step can
park in one process and resume in another.
"""

from __future__ import annotations

import asyncio
from typing import Any

from lattice_worker import AssistantModelMessage, ScriptedModelClient, create_agent, define_agent, tool
from lattice_worker.team import create_team, team_member
from tests.e2e.teams import _first_text

CALL_USAGE = {
    "input_tokens": 150,
    "cache_creation_input_tokens": 40,
    "cache_read_input_tokens": 60,
    "output_tokens": 100,
}
"""The usage every model call of the team reports (prompt-cache writes and reads included)."""

CALL_TOKENS = sum(CALL_USAGE.values())
"""Tokens one call spends (350): input, cache writes, cache reads and output alike."""


def run_tokens(asks: int) -> int:
    """What a run of ``asks`` asks spends in all."""
    return (asks + 1 + 2 * asks) * CALL_TOKENS


def _reply(content: list[dict[str, Any]], stop: str) -> AssistantModelMessage:
    return AssistantModelMessage(content=content, stop_reason=stop, usage=dict(CALL_USAGE))


def lead_model(request: Any) -> AssistantModelMessage:
    """Ask ``worker`` for ``task<k>`` while ``k`` (assistant turns so far) < N, then answer."""
    messages = request.messages
    asks = int(_first_text(messages[0]).strip() or "0")
    done = sum(1 for m in messages if m.get("role") == "assistant")
    if done < asks:
        call = {"type": "tool_use", "id": f"toolu_ask_{done}", "name": "worker"}
        call["input"] = {"mode": "ask", "task": f"task{done}"}
        return _reply([call], "tool_use")
    answers = []
    for message in messages:
        if message.get("role") == "user" and isinstance(message.get("content"), list):
            for block in message["content"]:
                if block.get("type") == "tool_result":
                    content = block.get("content")
                    answers.append(content if isinstance(content, str) else str(content))
    return _reply([{"type": "text", "text": "final: " + " | ".join(answers)}], "end_turn")


def member_model(request: Any) -> AssistantModelMessage:
    """``jot`` on the item's first call, then ``team_reply`` with ``answer<k>``."""
    messages = request.messages
    start = max(i for i, m in enumerate(messages) if m.get("role") == "user" and _first_text(m))
    item = messages[start:]
    if not any(m.get("role") == "assistant" for m in item):
        call = {"type": "tool_use", "id": "toolu_jot", "name": "jot", "input": {"note": "working"}}
        return _reply([call], "tool_use")
    prompt = _first_text(item[0])
    task = next((w for w in prompt.split() if w.startswith("task")), "task?")
    answer = "answer" + task.removeprefix("task")
    call = {"type": "tool_use", "id": "toolu_reply", "name": "team_reply", "input": {"content": answer}}
    return _reply([call], "tool_use")


def parallel_run_tokens(asks: int) -> int:
    """What a run of team "e2e_budget_parallel" with ``asks`` asks spends in all."""
    return (2 + 2 * asks) * CALL_TOKENS


MEMBER_CALL_SECONDS = 0.05
"""How long a model call of the parallel team's member takes."""


def parallel_lead_model(request: Any) -> AssistantModelMessage:
    """Ask ``worker`` for ``task0`` .. ``task<N-1>`` in one turn, then answer."""
    messages = request.messages
    if any(m.get("role") == "assistant" for m in messages):  # the tool results are in
        results = [b for m in messages if isinstance(m.get("content"), list) for b in m["content"]]
        answers = [str(b.get("content")) for b in results if b.get("type") == "tool_result"]
        return _reply([{"type": "text", "text": "final: " + " | ".join(answers)}], "end_turn")
    asks = int(_first_text(messages[0]).strip() or "0")
    calls = [
        {
            "type": "tool_use",
            "id": f"toolu_ask_{k}",
            "name": "worker",
            "input": {"mode": "ask", "task": f"task{k}"},
        }
        for k in range(asks)
    ]
    return _reply(calls, "tool_use")


async def slow_member_model(request: Any) -> AssistantModelMessage:
    """:func:`member_model` after :data:`MEMBER_CALL_SECONDS`."""
    await asyncio.sleep(MEMBER_CALL_SECONDS)
    return member_model(request)


@tool(effect="read_only")
async def jot(note: str) -> str:
    """Write a note down (does nothing; a member's first tool call)."""
    return f"noted: {note}"


def build_team(
    name: str = "e2e_budget",
    budget: dict[str, int] | None = None,
    auto_compact: Any = None,
    parallel: bool = False,
    session: bool = False,
) -> Any:
    """The "e2e_budget" team (see the module doc); ``budget``: its default
    budget; ``auto_compact``: the lead's (off by default); ``parallel``: the
    lead asks all at once and the member's calls take a moment; ``session``:
    ``worker`` is a session member (a live ``Agent``: one conversation, serial)."""
    lead = define_agent(
        name="lead",
        model_client=ScriptedModelClient(parallel_lead_model if parallel else lead_model),
        max_turns=20,
        workspace=False,
        auto_compact=auto_compact,
    )
    worker = (create_agent if session else define_agent)(
        name="worker",
        model_client=ScriptedModelClient(slow_member_model if parallel else member_model),
        tools=[jot],
        max_turns=8,
        workspace=False,
    )
    members = [team_member(name="worker", agent=worker)]
    runner = {"max_concurrent_work_items": 8} if parallel else None
    return create_team(name=name, lead=lead, members=members, budget=budget, runner=runner)


team = build_team()
default_team = build_team("e2e_budget_default", {"tokens": 2_000})
"""The same team with a default budget of 2,000 tokens."""
compact_team = build_team(
    "e2e_budget_compact", auto_compact={"threshold_tokens": 100, "keep_recent_messages": 2}
)
"""The same team whose lead compacts after every tool batch (its context is past 100 tokens)."""
parallel_team = build_team("e2e_budget_parallel", parallel=True)
"""The team whose lead asks all at once (see the module doc)."""
session_team = build_team("e2e_budget_session", session=True)
"""The team whose member is a session member (see :func:`build_team`)."""
