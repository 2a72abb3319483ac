"""Teams for the distributed-runtime tests (in-process protocol tests and real workers).

Every model is a *stateless* callable of the request (docs/testing.md), so a run
can suspend in one process and resume in another. The plan of a run is in its
prompt, as JSON::

    {"calls": [{"member": "worker", "mode": "handoff", "task": "a"}, ...]}

The lead calls those members in one tool batch; once the results are back it
answers ``"final: "`` + the answers joined with ``" | "`` (ask results in call
order, then the handoff reports in handoff order). A plain-text prompt gets a
direct answer ``"direct: <prompt>"`` with no member call.

Template members (``worker``, ``other``) call the ``work`` tool once with the
task and then ``team_reply`` with the tool's output. ``work`` and ``chore``
are declared ``read_only`` (docs/tool-effects.md): after a crash they run again. ``work`` records what
happens in Redis under the test's key prefix (``LATTICE_KEY_PREFIX``):

* ``<prefix>:test:exec:<task>`` -- INCR per execution;
* ``<prefix>:test:log`` -- RPUSH ``start:<task>`` / ``end:<task>``;
* ``<prefix>:test:pids`` -- RPUSH ``<task>:<pid of the process that ran it>``.

Task words change its behaviour: ``sleep=<s>`` sleeps ``s`` seconds;
``hang-first`` sleeps 60 s on its first execution only (to be killed);
``exit-first`` raises ``SystemExit`` on its first execution only;
``barrier=<n>`` waits (up to 30 s) until ``n`` executions have started;
``fail`` makes the member end without replying (a no-reply failure);
``followup`` makes it send the output with ``team_followup`` instead of
``team_reply`` (the message stays open: outcome ``open``).

The e2e lead also has a tool of its own, ``chore`` (a plan call with member
``"chore"`` calls it; it does what ``work`` does, so ``hang-first`` stalls the
lead's tool batch on its first execution).

Teams: ``team`` ("e2e": lead + ``worker`` + ``other``, max 4 concurrent work
items), ``session_team`` ("e2e_session": member ``clerk`` is a live Agent,
serial), ``nested_team`` ("e2e_company" whose member ``eng`` is the team
"e2e_eng" with member ``backend``), ``compact_team`` ("e2e_compact": the
``team`` members under a lead with ``auto_compact`` whose every response
reports :data:`COMPACT_REPORTED_TOKENS` input tokens, past its threshold),
``blocking_team`` ("e2e_blocking": lead + ``worker``, whose ``work`` is a plain
blocking function: ``sleep=<s>`` is ``time.sleep``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import time
from typing import Any

import redis as redis_sync

from lattice_worker import AssistantModelMessage, ScriptedModelClient, create_agent, define_agent, tool
from lattice_worker.team import create_team, team_member
from lattice_worker.team.reports import parse_report_message
from tests.support.services import deployment_redis_url


def _prefix() -> str:
    return os.environ.get("LATTICE_KEY_PREFIX", "lattice")


TOOL_CLIENT_NAME = "lattice-test-tool"
"""The Redis client name of the test tools' own connections (tests killing
connections spare them: they are the test's instruments, not the product)."""


def _redis() -> redis_sync.Redis:
    """A client whose connection is open and named: a test killing connections spares
    it only once its ``CLIENT SETNAME`` ran, and redis-py's handshake sends a health
    ``PING`` first, so a connection killed in that window is opened again here (a
    ``PING`` is safe to repeat) before the tool writes anything."""
    client = redis_sync.Redis.from_url(deployment_redis_url(), client_name=TOOL_CLIENT_NAME)
    for attempt in range(10):
        try:
            client.ping()
            return client
        except redis_sync.ConnectionError:
            if attempt == 9:
                raise
            time.sleep(0.05)
    return client


def _tool_use(name: str, inp: dict[str, Any], tid: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": name, "input": inp}


def _text(text: str) -> AssistantModelMessage:
    return AssistantModelMessage(content=[{"type": "text", "text": text}], stop_reason="end_turn")


def _first_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    for block in content or []:
        if block.get("type") == "text":
            return str(block.get("text", ""))
    return ""


# -- the lead -------------------------------------------------------------------------------


def lead_model(request: Any) -> AssistantModelMessage:
    """Stateless lead: plan from the prompt, then answer from the results."""
    messages = request.messages
    prompt = _first_text(messages[0])
    try:
        plan = json.loads(prompt)
    except ValueError:
        plan = None
    if not isinstance(plan, dict):
        return _text(f"direct: {prompt}")
    if len(messages) == 1:
        calls = plan.get("calls", [])
        return AssistantModelMessage(
            content=[
                _tool_use(
                    c["member"],
                    {"mode": c.get("mode", "handoff"), "task": c["task"]},
                    f"toolu_{i}_{c['member']}",
                )
                for i, c in enumerate(calls)
            ],
            stop_reason="tool_use",
        )
    answers: list[str] = []
    for message in messages[1:]:
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        # one user turn: the tool results first, then (merged into it by the request
        # normalisation) the handoff reports that arrived after the batch
        for block in message["content"]:
            if block.get("type") == "tool_result":
                content = block.get("content")
                text = content if isinstance(content, str) else json.dumps(content)
                if not text.startswith("{"):  # handoff receipts are JSON; ask answers are text
                    answers.append(("error:" if block.get("is_error") else "ask:") + text)
        answers += [f"{e['status']}:{e['content']}" for e in parse_report_message(message)]
    return _text("final: " + " | ".join(answers))


# -- members ----------------------------------------------------------------------------------


def _task_of(prompt: str) -> str:
    # member_prompt() wraps the task: "... from <lead>:\n\n<task>\n\nWhen your work ..."
    match = re.search(r"from [^\n]+:\n\n(.*?)\n\nWhen your work", prompt, re.S)
    return match.group(1).strip() if match else prompt.strip()


def member_model(request: Any) -> AssistantModelMessage:
    """Stateless member: ``work`` once, ``team_reply`` with its output, then stop."""
    messages = request.messages
    # the conversation of this work item starts at its last plain-text prompt
    start = max(i for i, m in enumerate(messages) if m.get("role") == "user" and _first_text(m))
    item = messages[start:]
    task = _task_of(_first_text(item[0]))
    if len(item) == 1:
        return AssistantModelMessage(
            content=[_tool_use("work", {"task": task}, "toolu_work")], stop_reason="tool_use"
        )
    if len(item) == 3:
        output = item[2]["content"][0].get("content")
        if "fail" in task.split():
            return _text(f"I give up on {task}")
        if "followup" in task.split():
            return AssistantModelMessage(
                content=[_tool_use("team_followup", {"content": f"progress: {output}"}, "toolu_followup")],
                stop_reason="tool_use",
            )
        return AssistantModelMessage(
            content=[_tool_use("team_reply", {"content": f"{output}"}, "toolu_reply")], stop_reason="tool_use"
        )
    return _text("replied")


@tool(effect="read_only")  # so a re-claimed member runs it again (docs/tool-effects.md)
async def work(task: str) -> str:
    """Do the task (records executions in Redis for the tests)."""
    return await _work(task)


@tool(effect="read_only")  # so a recovered lead runs it again
async def chore(task: str, mode: str = "ask") -> str:
    """A lead's own tool (not a member): does the task like ``work`` (``mode`` is ignored)."""
    return await _work(task)


async def _work(task: str) -> str:
    client = _redis()
    prefix = _prefix()
    try:
        count = client.incr(f"{prefix}:test:exec:{task}")
        client.rpush(f"{prefix}:test:log", f"start:{task}")
        client.rpush(f"{prefix}:test:pids", f"{task}:{os.getpid()}")
        words = task.split()
        for word in words:
            if word.startswith("sleep="):
                await asyncio.sleep(float(word.split("=", 1)[1]))
            if word == "hang-first" and count == 1:
                await asyncio.sleep(60)
            if word == "exit-first" and count == 1:
                raise SystemExit(3)  # what a library calling sys.exit() does to its caller
            if word.startswith("barrier="):
                want = int(word.split("=", 1)[1])
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    started = [
                        x for x in client.lrange(f"{prefix}:test:log", 0, -1) if x.startswith(b"start:")
                    ]
                    if len(started) >= want:
                        break
                    await asyncio.sleep(0.05)
        client.rpush(f"{prefix}:test:log", f"end:{task}")
        return f"worked[{task}]"
    finally:
        client.close()


def _member_spec(name: str) -> Any:
    return define_agent(name=name, model_client=ScriptedModelClient(member_model), tools=[work], max_turns=8)


def _executors() -> list[Any]:
    return [
        team_member(name="worker", agent=_member_spec("worker"), role="executor"),
        team_member(name="other", agent=_member_spec("other"), role="executor"),
    ]


def build_team() -> Any:
    """The "e2e" team: lead (with its own tool ``chore``) + template members ``worker`` and ``other``."""
    lead = define_agent(name="lead", model_client=ScriptedModelClient(lead_model), tools=[chore], max_turns=8)
    return create_team(
        name="e2e",
        lead=lead,
        members=_executors(),
        runner={"max_concurrent_work_items": 4},
    )


def build_session_team() -> Any:
    """The "e2e_session" team: member ``clerk`` is a live Agent (a session member)."""
    lead = define_agent(name="lead", model_client=ScriptedModelClient(lead_model), max_turns=8)
    clerk = create_agent(
        name="clerk", model_client=ScriptedModelClient(member_model), tools=[work], max_turns=8
    )
    return create_team(
        name="e2e_session",
        lead=lead,
        members=[team_member(name="clerk", agent=clerk)],
        runner={"max_concurrent_work_items": 4},
    )


def build_nested_team() -> Any:
    """ "e2e_company" (lead + member ``eng``) where ``eng`` is the team "e2e_eng"
    (lead + template member ``backend``). The company lead's task for ``eng``
    is itself a plan the engineering lead follows."""
    eng = create_team(
        name="e2e_eng",
        lead=define_agent(name="eng-lead", model_client=ScriptedModelClient(lead_model), max_turns=8),
        members=[team_member(name="backend", agent=_member_spec("backend"))],
    )
    return create_team(
        name="e2e_company",
        lead=define_agent(name="ceo", model_client=ScriptedModelClient(lead_model), max_turns=8),
        members=[team_member(name="eng", agent=eng, role="head")],
    )


COMPACT_THRESHOLD = 1_000
COMPACT_REPORTED_TOKENS = 5_000
SUMMARY_USAGE = {"input_tokens": 321, "output_tokens": 12}
PLAN_MARK = "PLAN: "


def compacting_lead_model(request: Any) -> AssistantModelMessage:
    """The "e2e_compact" lead: :func:`lead_model` with usage past the threshold.

    A summary request (no tools) is answered ``"PLAN: <the run's plan>"`` -- the
    plan read from the transcript -- so the compacted history still holds the
    plan; a request whose first message is that summary is played as if the
    plan were the prompt. Each turn request is recorded in Redis (RPUSH
    ``<prefix>:test:lead_requests``, JSON ``{"pid", "messages", "first"}``: the
    process, the message count and the first message's first 60 characters)."""
    messages = request.messages
    if not request.tools:
        transcript = _first_text(messages[-1])
        if PLAN_MARK in transcript:
            plan_text = transcript.split(PLAN_MARK, 1)[1].split("\n", 1)[0]
        else:
            plan_text = transcript.split("[user]\n", 1)[1].split("\n", 1)[0]
        reply = _text(PLAN_MARK + plan_text)
        reply.usage = dict(SUMMARY_USAGE)
        return reply
    first = _first_text(messages[0])
    client = _redis()
    try:
        record = {"pid": os.getpid(), "messages": len(messages), "first": first[:60]}
        client.rpush(f"{_prefix()}:test:lead_requests", json.dumps(record))
    finally:
        client.close()
    if PLAN_MARK in first:
        request = copy.copy(request)
        request.messages = [{"role": "user", "content": first.split(PLAN_MARK, 1)[1]}, *messages[1:]]
    reply = lead_model(request)
    reply.usage = {"input_tokens": COMPACT_REPORTED_TOKENS, "output_tokens": 10}
    return reply


def build_compact_team() -> Any:
    """The "e2e_compact" team: ``worker`` and ``other`` under a compacting lead
    (threshold :data:`COMPACT_THRESHOLD`, the last 2 messages kept)."""
    lead = define_agent(
        name="compact-lead",
        model_client=ScriptedModelClient(compacting_lead_model),
        max_turns=8,
        auto_compact={"threshold_tokens": COMPACT_THRESHOLD, "keep_recent_messages": 2},
    )
    return create_team(
        name="e2e_compact",
        lead=lead,
        members=_executors(),
    )


@tool(name="work", effect="read_only")
def blocking_work(task: str) -> str:
    """Do the task with blocking calls (a plain function): ``sleep=<s>`` is ``time.sleep``."""
    client = _redis()
    prefix = _prefix()
    try:
        client.incr(f"{prefix}:test:exec:{task}")
        client.rpush(f"{prefix}:test:log", f"start:{task}")
        for word in task.split():
            if word.startswith("sleep="):
                time.sleep(float(word.split("=", 1)[1]))
        client.rpush(f"{prefix}:test:log", f"end:{task}")
        return f"worked[{task}]"
    finally:
        client.close()


def build_blocking_team() -> Any:
    """The "e2e_blocking" team: lead + template member ``worker`` whose ``work``
    tool is a plain (blocking) function."""
    lead = define_agent(name="lead", model_client=ScriptedModelClient(lead_model), max_turns=8)
    worker = define_agent(
        name="worker", model_client=ScriptedModelClient(member_model), tools=[blocking_work], max_turns=8
    )
    return create_team(
        name="e2e_blocking",
        lead=lead,
        members=[team_member(name="worker", agent=worker)],
        runner={"max_concurrent_work_items": 4},
    )


team = build_team()
session_team = build_session_team()
nested_team = build_nested_team()
compact_team = build_compact_team()
blocking_team = build_blocking_team()


def plan(*calls: tuple[str, str, str]) -> str:
    """A run prompt: ``plan(("worker", "handoff", "task a"), ...)``."""
    return json.dumps({"calls": [{"member": m, "mode": mode, "task": t} for m, mode, t in calls]})
