"""Member mailbox tools, the lead's optional mailbox tools, the no-reply
diagnostic, fencing, and bad input to team tools.

Design: docs/architecture.md (the mailbox state machine, teams, fencing) and
docs/tutorial.md (model-facing tool inputs). Every test runs
against MemoryMailbox and RedisMailbox (real Redis, unique prefix, keys
deleted after).
"""

from __future__ import annotations

import json
from typing import Any

from lattice_mailbox import MessageStatus
from lattice_worker import ModelRequest, ScriptedModelClient, create_agent, text_turn, tool_turn
from lattice_worker.team import create_team, parse_report_message, run_work_item, team_member

TEAM_TOOLS = {"team_send", "team_inbox", "team_read", "team_reply", "team_followup", "team_status"}


def team_tools(agent: Any) -> list[str]:
    """The names of an agent's tools, its built-in workspace tools left out."""
    return [t.name for t in agent.tools if not (t.metadata or {}).get("builtin")]


def tool_results(request: ModelRequest) -> list[dict[str, Any]]:
    """The tool_result blocks of the last user message of a request."""
    content = request.messages[-1]["content"]
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def reports_of(request: ModelRequest) -> list[dict[str, Any]]:
    for message in reversed(request.messages):
        entries = parse_report_message(message)
        if entries:
            return entries
    return []


def lead_client(*calls: tuple[str, dict[str, Any]]) -> ScriptedModelClient:
    return ScriptedModelClient([tool_turn(*calls), text_turn("lead done")])


async def test_member_tools_send_followup_status_and_reply(mailbox: Any) -> None:
    a_client = ScriptedModelClient(
        [
            tool_turn(("team_send", {"to": "b", "content": "hello b"}), ("team_status", {})),
            tool_turn(("team_followup", {"content": "halfway there"})),
            tool_turn(("team_reply", {"content": "final from a"})),
            text_turn("thanks, noted"),  # played later, when a drain tells a about b's reply
        ]
    )
    b_client = ScriptedModelClient([tool_turn(("team_reply", {"content": "hi a, b here"}))])
    a = create_agent(name="a", model_client=a_client)
    b = create_agent(name="b", model_client=b_client)
    lead = lead_client(("a", {"mode": "handoff", "task": "do a"}))
    team = create_team(
        name="mt1",
        lead=create_agent(name="lead", model_client=lead),
        members=[team_member(name="a", agent=a), team_member(name="b", agent=b)],
        mailbox=mailbox,
    )
    events = [e async for e in team.query("go", stream=False)]
    assert sorted(team_tools(a)) == sorted(TEAM_TOOLS)

    send_result, status_result = tool_results(a_client.requests[1])
    sent = json.loads(send_result["content"])
    assert sent["status"] == "sent" and sent["to"] == "mt1::b"
    status = json.loads(status_result["content"])["mailboxes"]
    assert status["mt1::a"] == {"processing": 1}
    assert status["mt1::b"] == {"pending": 1}

    b_inbox = await mailbox.inbox("mt1::b", "pending")
    assert [(m.content, m.from_, m.metadata["kind"]) for m in b_inbox] == [("hello b", "mt1::a", "message")]
    assert b_client.requests == []  # nobody routes it: b is not part of the lead's batch

    task = (await mailbox.inbox("mt1::a", "all"))[0]
    upstream = [m for m in await mailbox.inbox("mt1::lead", "all") if m.reply_to == task.id]
    assert [(m.metadata["kind"], m.content) for m in upstream] == [
        ("followup", "halfway there"),
        ("reply", "final from a"),
    ]
    assert task.status == MessageStatus.DONE
    subtypes = [e.subtype for e in events if e.type == "team_message"]
    assert subtypes == ["sent", "claimed", "sent", "followup", "reply", "done"]

    # Drain b: it answers a's message; the reply lands in a's mailbox as information, and a
    # second drain round informs a without requiring another reply (no ping-pong).
    first = await team.drain(max_rounds=1, max_messages=10)
    assert (first.processed, first.failed, first.rounds) == (1, 0, 1)
    reply_to_a = await mailbox.inbox("mt1::a", "pending")
    assert [(m.content, m.metadata["kind"]) for m in reply_to_a] == [("hi a, b here", "reply")]
    a_client_turns = len(a_client.requests)
    second = await team.drain(max_rounds=5, max_messages=10)
    assert (second.processed, second.failed, second.rounds) == (1, 0, 1)
    last = a_client.requests[a_client_turns].messages[-1]["content"]  # its last results + the new prompt
    assert "no reply is required" in last[-1]["text"]
    assert (await mailbox.get(reply_to_a[0].id)).status == MessageStatus.DONE
    assert await mailbox.inbox("mt1::b", "pending") == []


async def test_team_read_opens_a_message_that_team_reply_can_close_by_id(mailbox: Any) -> None:
    # b (first in the batch) sends a question to a; a's own task was queued before it.
    b_client = ScriptedModelClient(
        [
            tool_turn(
                ("team_send", {"to": "a", "content": "what is your status?"}),
                ("team_reply", {"content": "b ok"}),
            )
        ]
    )

    def a_play(request: ModelRequest) -> Any:
        turn = len(request.messages)
        if turn == 1:
            return tool_turn(("team_inbox", {}))
        if turn == 3:
            listing = json.loads(tool_results(request)[0]["content"])
            question = listing["messages"][0]
            return tool_turn(("team_read", {"message_id": question["id"]}))
        if turn == 5:
            opened = json.loads(tool_results(request)[0]["content"])
            return tool_turn(
                ("team_reply", {"content": "status: green", "message_id": opened["id"]}),
                ("team_reply", {"content": "a done"}),
            )
        return text_turn("unexpected")

    a_client = ScriptedModelClient(a_play)
    team = create_team(
        name="mt2",
        lead=create_agent(
            name="lead",
            model_client=lead_client(
                ("b", {"mode": "handoff", "task": "tb"}), ("a", {"mode": "handoff", "task": "ta"})
            ),
        ),
        members=[
            team_member(name="a", agent=create_agent(name="a", model_client=a_client)),
            team_member(name="b", agent=create_agent(name="b", model_client=b_client)),
        ],
        mailbox=mailbox,
    )
    await team.prompt("go", stream=False)
    listing = json.loads(tool_results(a_client.requests[1])[0]["content"])
    assert [m["content"] for m in listing["messages"]] == ["what is your status?"]
    opened = json.loads(tool_results(a_client.requests[2])[0]["content"])
    assert opened["status"] == "read" and opened["content"] == "what is your status?"

    question = (await mailbox.inbox("mt2::a", "all"))[-1]
    assert question.content == "what is your status?" and question.status == MessageStatus.DONE
    answers = [m for m in await mailbox.inbox("mt2::b", "all") if m.reply_to == question.id]
    assert [(m.content, m.from_) for m in answers] == [("status: green", "mt2::a")]
    task = (await mailbox.inbox("mt2::a", "all"))[0]
    assert task.status == MessageStatus.DONE


async def test_reply_to_a_message_never_claimed_is_refused_and_changes_nothing(mailbox: Any) -> None:
    foreign = await mailbox.send("mt3::lead", "mt3::b", "b's private task")
    a_client = ScriptedModelClient(
        [
            tool_turn(
                ("team_reply", {"content": "stolen", "message_id": foreign.id}),
                ("team_reply", {"content": "ghost", "message_id": "0000000000000000-" + "0" * 32}),
            ),
            tool_turn(("team_reply", {"content": "proper answer"})),
        ]
    )
    lead = lead_client(("a", {"mode": "handoff", "task": "ta"}))
    team = create_team(
        name="mt3",
        lead=create_agent(name="lead", model_client=lead),
        members=[
            team_member(name="a", agent=create_agent(name="a", model_client=a_client)),
            team_member(name="b", agent=create_agent(name="b", model_client=ScriptedModelClient([]))),
        ],
        mailbox=mailbox,
    )
    await team.prompt("go", stream=False)
    refused, missing = tool_results(a_client.requests[1])
    assert refused["is_error"] is True and "not to your mailbox" in refused["content"]
    assert missing["is_error"] is True and "no message with id" in missing["content"]
    assert (await mailbox.get(foreign.id)).status == MessageStatus.PENDING
    for box in ("mt3::lead", "mt3::b", "mt3::a"):
        assert all(m.reply_to != foreign.id for m in await mailbox.inbox(box, "all"))
    assert reports_of(lead.requests[1])[0]["content"] == "proper answer"


async def test_member_without_reply_fails_and_a_diagnostic_goes_upstream(mailbox: Any) -> None:
    silent = create_agent(name="silent", model_client=ScriptedModelClient([text_turn("I looked at it.")]))
    lead = lead_client(("silent", {"mode": "handoff", "task": "look"}))
    team = create_team(
        name="mt4",
        lead=create_agent(name="lead", model_client=lead),
        members=[team_member(name="silent", agent=silent)],
        mailbox=mailbox,
    )
    events = [e async for e in team.query("go", stream=False)]
    task = (await mailbox.inbox("mt4::silent", "all"))[0]
    assert task.status == MessageStatus.FAILED
    diagnostic = [m for m in await mailbox.inbox("mt4::lead", "all") if m.reply_to == task.id]
    assert len(diagnostic) == 1
    assert diagnostic[0].metadata["kind"] == "diagnostic"
    assert diagnostic[0].metadata["error"]["code"] == "no_reply"
    assert "I looked at it." in diagnostic[0].content
    failed = [e for e in events if e.type == "team_message" and e.subtype == "failed"]
    assert failed[0].error["code"] == "no_reply"
    entry = reports_of(lead.requests[1])[0]
    assert entry["status"] == "failed" and entry["error"]["code"] == "no_reply"
    assert events[-1].subtype == "success"


async def test_followup_only_leaves_the_message_open_until_a_later_reply(mailbox: Any) -> None:
    state: dict[str, str] = {}

    def member_play(request: ModelRequest) -> Any:
        first = request.messages[-1]["content"] if len(request.messages) else ""
        if isinstance(first, str) and "task one" in first:
            state["first_id"] = first.split("assigned message ")[1].split(" ")[0]
            return tool_turn(("team_followup", {"content": "started, more later"}))
        if isinstance(first, str) and "task two" in first:
            return tool_turn(
                ("team_reply", {"content": "task one finished", "message_id": state["first_id"]}),
                ("team_reply", {"content": "task two finished"}),
            )
        return text_turn("waiting")

    member = create_agent(name="m", model_client=ScriptedModelClient(member_play))
    lead = ScriptedModelClient(
        [
            tool_turn(("m", {"mode": "handoff", "task": "task one"})),
            tool_turn(("m", {"mode": "handoff", "task": "task two"})),
            text_turn("done"),
        ]
    )
    team = create_team(
        name="mt5",
        lead=create_agent(name="lead", model_client=lead),
        members=[team_member(name="m", agent=member)],
        mailbox=mailbox,
    )
    await team.prompt("go", stream=False)
    first_report = reports_of(lead.requests[1])[0]
    assert first_report["status"] == "open" and first_report["content"] == "started, more later"
    assert "error" not in first_report
    first = await mailbox.get(state["first_id"])
    assert first.status == MessageStatus.DONE  # closed later by id
    replies = [m for m in await mailbox.inbox("mt5::lead", "all") if m.reply_to == first.id]
    assert [(m.metadata["kind"], m.content) for m in replies] == [
        ("followup", "started, more later"),
        ("reply", "task one finished"),
    ]
    assert reports_of(lead.requests[2])[0]["content"] == "task two finished"


async def test_lead_gets_mailbox_tools_only_when_exposed(mailbox: Any) -> None:
    plain_lead = create_agent(name="plain", model_client=ScriptedModelClient([]))
    m1 = create_agent(name="m1", model_client=ScriptedModelClient([]))
    create_team(name="mt6a", lead=plain_lead, members=[team_member(name="m1", agent=m1)], mailbox=mailbox)
    assert team_tools(plain_lead) == ["m1"]

    lead_script = ScriptedModelClient(
        [
            tool_turn(("team_send", {"to": "m2", "content": "ping from lead"})),
            text_turn("sent"),
            tool_turn(("team_inbox", {})),
            lambda r: tool_turn(
                ("team_read", {"message_id": json.loads(tool_results(r)[0]["content"])["messages"][0]["id"]})
            ),
            text_turn("read it"),
        ]
    )
    lead = create_agent(name="lead", model_client=lead_script)
    m2 = create_agent(
        name="m2", model_client=ScriptedModelClient([tool_turn(("team_reply", {"content": "pong"}))])
    )
    team = create_team(
        name="mt6",
        lead=lead,
        members=[team_member(name="m2", agent=m2)],
        mailbox=mailbox,
        expose_lead_mailbox_tools=True,
    )
    assert set(team_tools(lead)) == {"m2"} | TEAM_TOOLS

    assert (await team.prompt("send a ping", stream=False)).result == "sent"
    assert [m.content for m in await mailbox.inbox("mt6::m2", "pending")] == ["ping from lead"]
    drained = await team.drain(max_rounds=3, max_messages=3)
    assert (drained.processed, drained.failed) == (1, 0)
    assert (await team.prompt("check the inbox", stream=False)).result == "read it"
    opened = json.loads(tool_results(lead_script.requests[4])[0]["content"])
    assert opened["content"] == "pong" and opened["status"] == "read"
    assert [m.status for m in await mailbox.inbox("mt6::lead", "all")] == [MessageStatus.READ]


async def test_handoff_to_unknown_member_and_missing_task_are_error_results(mailbox: Any) -> None:
    lead = ScriptedModelClient(
        [
            tool_turn(
                ("ghost", {"mode": "handoff", "task": "boo"}),
                ("m", {"mode": "handoff"}),
                ("m", {"mode": "ask", "task": "   "}),
                ("m", {"mode": "later", "task": "x"}),
            ),
            text_turn("recovered"),
        ]
    )
    member = create_agent(name="m", model_client=ScriptedModelClient([]))
    team = create_team(
        name="mt7",
        lead=create_agent(name="lead", model_client=lead),
        members=[team_member(name="m", agent=member)],
        mailbox=mailbox,
    )
    result = await team.prompt("go", stream=False)
    assert result.result == "recovered"
    ghost, no_task, blank, bad_mode = tool_results(lead.requests[1])
    assert ghost["is_error"] and 'unknown tool "ghost"' in ghost["content"] and "m" in ghost["content"]
    assert no_task["is_error"] and "task" in no_task["content"] and "required" in no_task["content"].lower()
    assert blank["is_error"] and "task must not be blank" in blank["content"]
    assert bad_mode["is_error"] and "mode" in bad_mode["content"]
    for box in ("mt7::m", "mt7::ghost", "mt7::lead"):
        assert await mailbox.inbox(box, "all") == []


async def test_member_tools_outside_a_team_run_change_nothing(mailbox: Any) -> None:
    client = ScriptedModelClient([tool_turn(("team_reply", {"content": "hi"})), text_turn("ok")])
    member = create_agent(name="m", model_client=client)
    create_team(
        name="mt8",
        lead=create_agent(name="lead", model_client=ScriptedModelClient([])),
        members=[team_member(name="m", agent=member)],
        mailbox=mailbox,
    )
    result = await member.prompt("reply please", stream=False)
    block = tool_results(client.requests[1])[0]
    assert block["is_error"] and "only be used inside a team run" in block["content"]
    assert result.result == "ok"
    assert await mailbox.inbox("mt8::lead", "all") == []


async def test_a_completion_fenced_out_by_a_new_claim_writes_nothing(mailbox: Any) -> None:
    client = ScriptedModelClient(
        [tool_turn(("team_reply", {"content": "late answer"})), text_turn("gave up")]
    )
    member = create_agent(name="m", model_client=client)
    team = create_team(
        name="mt9",
        lead=create_agent(name="lead", model_client=ScriptedModelClient([])),
        members=[team_member(name="m", agent=member)],
        mailbox=mailbox,
    )
    sent = await mailbox.send("mt9::lead", "mt9::m", "the task", work_item_id="wi_x")
    stale = await mailbox.claim_next("mt9::m", lease_s=5)
    moved = await mailbox.requeue_expired(now_ms=stale.lease_until + 1)  # the lease ran out
    assert [m.id for m in moved] == [sent.id]
    fresh = await mailbox.claim_next("mt9::m", lease_s=60)  # another worker owns it now
    assert fresh.claim_token != stale.claim_token

    outcome = await run_work_item(team, team.member("m"), stale, mailbox=mailbox, token=stale.claim_token)
    assert outcome.status == "failed" and outcome.error["code"] == "claim_lost"
    assert outcome.error["error_type"] == "ClaimTakenError"
    assert outcome.report is None
    block = tool_results(client.requests[1])[0]
    assert block["is_error"] and "taken by another worker" in block["content"]
    current = await mailbox.get(sent.id)
    assert current.status == MessageStatus.PROCESSING and current.attempts == 2
    assert await mailbox.inbox("mt9::lead", "all") == []  # no reply, no failure report
    # the successor can still finish it
    await mailbox.complete(sent.id, fresh.claim_token, "done")
    assert (await mailbox.get(sent.id)).status == MessageStatus.DONE


async def test_messages_too_large_for_the_store_are_refused_before_anything_changes(
    small_mailbox: Any,
) -> None:
    mailbox = small_mailbox
    big = "y" * 20_000
    member_client = ScriptedModelClient(
        [tool_turn(("team_reply", {"content": big})), tool_turn(("team_reply", {"content": "short"}))]
    )

    class Host:
        async def prompt(self, text: str) -> str:
            return big  # a host's final answer becomes its reply: too large as well

    lead = lead_client(
        ("m", {"mode": "handoff", "task": "t"}),
        ("h", {"mode": "handoff", "task": "t"}),
        ("m", {"mode": "handoff", "task": big}),
    )
    team = create_team(
        name="mt10",
        lead=create_agent(name="lead", model_client=lead),
        members=[
            team_member(name="m", agent=create_agent(name="m", model_client=member_client)),
            team_member(name="h", agent=Host()),
        ],
        mailbox=mailbox,
    )
    assert (await team.prompt("go", stream=False)).result == "lead done"

    batch = lead.requests[1].messages[-1]["content"]  # the tool results, then the reports
    too_big_task = batch[2]
    assert too_big_task["is_error"] and "too large for the team mailbox" in too_big_task["content"]
    assert "Nothing was sent" in too_big_task["content"]
    (task,) = await mailbox.inbox("mt10::m", "all")  # the oversized task never entered the mailbox

    # the member's oversized reply was refused while its message stayed open; the retry closed it
    refused = tool_results(member_client.requests[1])[0]
    assert refused["is_error"] and f"message {task.id} is still open" in refused["content"]
    assert task.status == MessageStatus.DONE
    upstream = [m for m in await mailbox.inbox("mt10::lead", "all") if m.reply_to == task.id]
    assert [(m.metadata["kind"], m.content) for m in upstream] == [("reply", "short")]

    # the host's oversized answer: its message failed with a small failure report, nothing lost
    (host_task,) = await mailbox.inbox("mt10::h", "all")
    assert host_task.status == MessageStatus.FAILED
    (report,) = [m for m in await mailbox.inbox("mt10::lead", "all") if m.reply_to == host_task.id]
    assert report.metadata["kind"] == "failure" and report.metadata["error"]["code"] == "reply_failed"
    assert "final answer is too large to send upstream" in report.metadata["error"]["message"]
    entries = reports_of(lead.requests[1])
    assert [(e["member"], e["status"], e.get("error", {}).get("code")) for e in entries] == [
        ("m", "done", None),
        ("h", "failed", "reply_failed"),
    ]


async def test_bad_member_tool_calls_are_clear_error_results_and_change_nothing(mailbox: Any) -> None:
    foreign = await mailbox.send("mt11::lead", "mt11::b", "b's private task")
    a_client = ScriptedModelClient(
        [
            tool_turn(
                ("team_send", {"to": "ghost", "content": "hi"}),
                ("team_send", {"to": "other::b", "content": "hi"}),
                ("team_inbox", {"status": "weird"}),
                ("team_read", {"message_id": foreign.id}),
                ("team_followup", {"content": "psst", "message_id": foreign.id}),
            ),
            tool_turn(("team_reply", {"content": "done"})),
        ]
    )
    team = create_team(
        name="mt11",
        lead=create_agent(name="lead", model_client=lead_client(("a", {"mode": "handoff", "task": "ta"}))),
        members=[
            team_member(name="a", agent=create_agent(name="a", model_client=a_client)),
            team_member(name="b", agent=create_agent(name="b", model_client=ScriptedModelClient([]))),
        ],
        mailbox=mailbox,
    )
    await team.prompt("go", stream=False)
    ghost, other_team, bad_status, read_foreign, followup_foreign = tool_results(a_client.requests[1])
    assert all(block["is_error"] for block in (ghost, other_team, bad_status, read_foreign, followup_foreign))
    assert ghost["content"] == (
        'Error: team_send: unknown recipient "ghost" in team "mt11"; valid recipients: lead, a, b. '
        "Nothing was sent."
    )
    assert 'unknown recipient "other::b"' in other_team["content"]
    assert "team_inbox: unknown message status 'weird'" in bad_status["content"]
    assert '(or "all" for every status)' in bad_status["content"]
    assert "not to your mailbox" in read_foreign["content"] and "Nothing changed" in read_foreign["content"]
    assert "team_followup" in followup_foreign["content"] and "Nothing changed" in followup_foreign["content"]
    assert (await mailbox.get(foreign.id)).status == MessageStatus.PENDING
    assert [m.content for m in await mailbox.inbox("mt11::b", "all")] == ["b's private task"]
    assert [(m.metadata["kind"], m.content) for m in await mailbox.inbox("mt11::lead", "all")] == [
        ("reply", "done")
    ]


async def test_a_member_runs_stream_events_can_be_left_out_of_its_events(mailbox: Any) -> None:
    # run_work_item(stream_events=False): what the distributed runtime asks for (its run
    # streams never store token-level events); the member's other events are unchanged.
    seen: dict[bool, list[str]] = {}
    for flag in (True, False):
        name = f"mts{int(flag)}"
        member = create_agent(
            name="m", model_client=ScriptedModelClient([tool_turn(("team_reply", {"content": "done"}))])
        )
        team = create_team(
            name=name,
            lead=create_agent(name="lead", model_client=ScriptedModelClient([])),
            members=[team_member(name="m", agent=member)],
            mailbox=mailbox,
        )
        await mailbox.send(f"{name}::lead", f"{name}::m", "the task", work_item_id=f"wi_{name}")
        claimed = await mailbox.claim_next(f"{name}::m", lease_s=30)
        events: list[Any] = []
        outcome = await run_work_item(
            team,
            team.member("m"),
            claimed,
            mailbox=mailbox,
            token=claimed.claim_token,
            emit=events.append,
            stream_events=flag,
        )
        assert outcome.status == "done" and outcome.report.content == "done"
        seen[flag] = [e.message["type"] if e.type == "agent_message" else e.type for e in events]
    assert "stream_event" in seen[True] and "stream_event" not in seen[False]
    assert [t for t in seen[True] if t != "stream_event"] == seen[False]
    assert seen[False].count("team_message") == 2 and seen[False].count("team_agent") == 2


async def test_team_send_run_again_for_the_same_call_sends_once(mailbox: Any) -> None:
    """A ``team_send`` re-run after a crash (same call: same effect key, same text) returns the
    message its first run sent; another call (another key) or another text sends anew."""
    from types import SimpleNamespace

    from lattice_worker.team.mailbox_state import MailboxToolState
    from lattice_worker.team.member_tools import make_mailbox_tools
    from lattice_worker.tools.tool_result import ToolContext

    [send] = [t for t in make_mailbox_tools() if t.name == "team_send"]
    state = MailboxToolState(team_name="ms", self_name="a", member_names=["a", "b"], mailbox=mailbox)
    runtime = SimpleNamespace(team_mailbox_state=state)

    async def run(key: str, content: str = "hello b") -> str:
        ctx = ToolContext(tool_use_id="toolu_1", tool_name="team_send", runtime=runtime, effect_key=key)
        result = await send.invoke(send.parse_input({"to": "b", "content": content}), ctx)
        assert not result.is_error, result
        return json.loads(result.content)["message_id"]

    first = await run("item-1:toolu_1")
    assert await run("item-1:toolu_1") == first  # the re-run: nothing new sent
    assert len({first, await run("item-2:toolu_1"), await run("item-1:toolu_1", "other text")}) == 3
    assert len(await mailbox.inbox("ms::b", "all")) == 3
