"""Teams for the crash-safe tool call tests (docs/tool-effects.md): a tool per
effect, each recording what it did in Redis under the test's key prefix.

The run prompt is JSON: ``{"member": "<tool> <label>"}`` (the lead asks member
``m`` -- or ``gate``, whose tools need approvals, or the session member ``s`` -- to do it) or
``{"lead": "<tool> <label>"}`` (the lead calls its own tools). Either way the
agent first calls ``prep <label>`` (an unguarded tool: it must never run twice),
then ``<tool> <label>``, then answers with that tool's output (a member through
``team_reply``; the lead answers ``final: <output>``).

Every tool INCRs ``<prefix>:test:exec:<tool>:<label>`` and RPUSHes
``start:<tool>:<label>`` to ``<prefix>:test:log``. With ``hang`` in the label
it then sleeps 60 s on its first execution (to be killed there); the
"provider" of ``charge`` / ``charge_checked`` records an effect per effect key
(``<prefix>:test:provider:<key>``, ``<prefix>:test:provider:count:<label>``
counting the distinct keys it saw), before the hang -- or, with ``late`` in the
label, after it (the crash came before the provider saw the call).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

import redis as redis_sync

from lattice_worker import (
    AssistantModelMessage,
    LookupFound,
    LookupNotFound,
    Reconcile,
    ScriptedModelClient,
    ToolContext,
    create_agent,
    define_agent,
    tool,
)
from lattice_worker.team import create_team, team_member
from tests.support.services import deployment_redis_url

TARGETS = ("lookup_docs", "charge", "charge_checked", "send_email")


def _prefix() -> str:
    return os.environ.get("LATTICE_KEY_PREFIX", "lattice")


def _redis() -> redis_sync.Redis:
    return redis_sync.Redis.from_url(deployment_redis_url())


def _start(name: str, label: str) -> int:
    client = _redis()
    try:
        client.rpush(f"{_prefix()}:test:log", f"start:{name}:{label}")
        return int(client.incr(f"{_prefix()}:test:exec:{name}:{label}"))
    finally:
        client.close()


def _provider(label: str, key: str) -> None:
    client = _redis()
    try:
        if client.set(f"{_prefix()}:test:provider:{key}", f"ch_{label}", nx=True):
            client.incr(f"{_prefix()}:test:provider:count:{label}")
        client.rpush(f"{_prefix()}:test:provider:keys:{label}", key)
    finally:
        client.close()


async def _hang(label: str, count: int) -> None:
    if "hang" in label.split("-") and count == 1:
        await asyncio.sleep(60)


@tool
def prep(label: str) -> str:
    """Prepare (an unguarded effect that must never happen twice)."""
    _start("prep", label)
    return f"prepped[{label}]"


@tool(effect="read_only")
async def lookup_docs(label: str) -> str:
    """Look something up (read-only)."""
    await _hang(label, _start("lookup_docs", label))
    return f"found[{label}]"


@tool(effect="idempotent", dedup_window_s=3600)
async def charge(label: str, ctx: ToolContext) -> str:
    """Charge a card; the provider drops a repeated effect key for an hour."""
    count = _start("charge", label)
    _provider(label, ctx.effect_key or "")
    await _hang(label, count)
    return f"charged[{label}]"


def _find_charge(key: str) -> Any:
    client = _redis()
    try:
        value = client.get(f"{_prefix()}:test:provider:{key}")
    finally:
        client.close()
    return LookupNotFound() if value is None else LookupFound(f"looked-up[{value.decode()}]")


@tool(effect="reconcilable", reconcile=Reconcile(_find_charge, finality="final"))
async def charge_checked(label: str, ctx: ToolContext) -> str:
    """Charge a card; the provider can tell whether a key was charged."""
    count = _start("charge_checked", label)
    late = "late" in label.split("-")
    if not late:
        _provider(label, ctx.effect_key or "")
    await _hang(label, count)
    if late:
        _provider(label, ctx.effect_key or "")
    return f"charged[{label}]"


@tool
async def send_email(label: str) -> str:
    """Send an email (unguarded)."""
    await _hang(label, _start("send_email", label))
    return f"sent[{label}]"


TOOLS = [prep, lookup_docs, charge, charge_checked, send_email]


def _tool_use(name: str, inp: dict[str, Any], tid: str) -> AssistantModelMessage:
    return AssistantModelMessage(
        content=[{"type": "tool_use", "id": tid, "name": name, "input": inp}], stop_reason="tool_use"
    )


def _text(text: str) -> AssistantModelMessage:
    return AssistantModelMessage(content=[{"type": "text", "text": text}], stop_reason="end_turn")


def _first_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return next((str(b.get("text", "")) for b in content or [] if b.get("type") == "text"), "")


def _result_text(message: dict[str, Any]) -> str:
    block = message["content"][0]
    content = block.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    return ("error:" if block.get("is_error") else "") + text


def _steps(item: list[dict[str, Any]], task: str, finish: Any) -> AssistantModelMessage:
    name, label = task.split()[:2]
    if len(item) == 1:
        return _tool_use("prep", {"label": label}, "toolu_prep")
    if len(item) == 3:
        return _tool_use(name, {"label": label}, "toolu_target")
    if len(item) == 5:
        return finish(_result_text(item[4]))
    return _text("done")


def member_model(request: Any) -> AssistantModelMessage:
    messages = request.messages
    # this item's conversation: from its task prompt on (a session member's holds earlier items before it)
    starts = [i for i, m in enumerate(messages) if "You have been assigned message" in _first_text(m)]
    item = messages[starts[-1] if starts else 0 :]
    # member_prompt() wraps the task: "... from <lead>:\n\n<task>\n\nWhen your work ..."
    match = re.search(r"from [^\n]+:\n\n(.*?)\n\nWhen your work", _first_text(item[0]), re.S)
    task = match.group(1).strip() if match else _first_text(item[0]).strip()
    return _steps(item, task, lambda out: _tool_use("team_reply", {"content": out}, "toolu_reply"))


def lead_model(request: Any) -> AssistantModelMessage:
    messages = request.messages
    plan = json.loads(_first_text(messages[0]))
    if "lead" in plan:
        return _steps(messages, plan["lead"], lambda out: _text(f"final: {out}"))
    member = plan.get("via", "m")
    if len(messages) == 1:
        return _tool_use(member, {"mode": "ask", "task": plan["member"]}, "toolu_ask")
    return _text(f"final: {_result_text(messages[2])}")


def _member_agent(make: Any, name: str, **options: Any) -> Any:
    """A member agent with the tools and the scripted member model
    (``make``: ``define_agent`` for a template, ``create_agent`` for a session)."""
    return make(
        name=name,
        model_client=ScriptedModelClient(member_model),
        tools=TOOLS,
        max_turns=10,
        workspace=False,
        **options,
    )


def build_team(*, gated_lead: bool = False) -> Any:
    """The "fx" team: lead (with the tools) + template members ``m`` (plain) and
    ``gate`` (``permission_mode="by_effect"``) + session member ``s`` (a live
    ``Agent``: one conversation across its work items, serial)."""
    lead = define_agent(
        name="lead",
        model_client=ScriptedModelClient(lead_model),
        tools=TOOLS,
        max_turns=10,
        workspace=False,
        permission_mode="by_effect" if gated_lead else "allow",
    )
    members = [
        team_member(name="m", agent=_member_agent(define_agent, "m")),
        team_member(name="gate", agent=_member_agent(define_agent, "gate", permission_mode="by_effect")),
        team_member(name="s", agent=_member_agent(create_agent, "s")),
    ]
    return create_team(name="fx" if not gated_lead else "fx_gated", lead=lead, members=members)


team = build_team()
gated_team = build_team(gated_lead=True)


def member_plan(task: str, via: str = "m") -> str:
    return json.dumps({"member": task, "via": via})


def lead_plan(task: str) -> str:
    return json.dumps({"lead": task})
