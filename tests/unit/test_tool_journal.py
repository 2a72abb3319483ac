"""The tool journal seam and recovery by effect, in one process with an
in-memory journal standing in for the run store: started before the handler,
completed after; a completed call never runs again; an interrupted call is
decided by its effect (docs/tool-effects.md)."""

from __future__ import annotations

import time

import pytest
from pydantic import BaseModel

from lattice_worker import (
    LookupFound,
    LookupNotFound,
    LookupUnknown,
    Reconcile,
    ScriptedModelClient,
    SuspendQuery,
    ToolContext,
    ToolResult,
    create_bare_agent,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.tools.recovery import JournalCall, JournalRecord, ToolJournal


class Q(BaseModel):
    q: str = ""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class MemoryJournal:
    """What the distributed runtime keeps per work item, in a dict."""

    def __init__(self) -> None:
        self.records: dict[str, JournalRecord] = {}
        self.log: list[tuple[str, str]] = []
        self.parked: list[tuple[str, str]] = []

    async def entry(self, call: JournalCall) -> JournalRecord | None:
        return self.records.get(call.tool_use_id)

    async def started(self, call: JournalCall) -> None:
        self.log.append(("started", call.tool_use_id))
        old = self.records.get(call.tool_use_id)
        first = old.started_at_ms if old is not None else now_ms()
        self.records[call.tool_use_id] = JournalRecord(call.tool_use_id, "started", call.effect_key, first)

    async def completed(self, call: JournalCall, record: JournalRecord) -> None:
        self.log.append(("completed", call.tool_use_id))
        self.records[call.tool_use_id] = record

    async def park(self, call: JournalCall, reason: str) -> None:
        self.parked.append((call.tool_use_id, reason))

    def interrupted(self, tool_use_id: str, *, key: str, age_s: float = 0) -> None:
        """A call a crash cut off: started, never completed."""
        self.records[tool_use_id] = JournalRecord(tool_use_id, "started", key, now_ms() - int(age_s * 1000))


class Runtime:
    effect_scope = "wi-1"

    def __init__(self, journal: MemoryJournal) -> None:
        self.tool_journal = journal


class Provider:
    """A tool whose effect happens somewhere else: counts what it did per key."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.keys: list[str | None] = []

    def handler(self, name: str):
        def run(_inp: Q, ctx: ToolContext) -> str:
            self.effects.append(name)
            self.keys.append(ctx.effect_key)
            return f"{name} done"

        return run


def test_the_memory_journal_satisfies_the_protocol():
    assert isinstance(MemoryJournal(), ToolJournal)


async def run_one(tools, calls, journal, *, after="ok"):
    client = ScriptedModelClient([tool_turn(*calls), text_turn(after)])
    agent = create_bare_agent(model_client=client, tools=tools)
    result = await agent.prompt("go", stream=False, runtime=Runtime(journal))
    return result, await agent.get_history()


async def test_each_call_is_recorded_started_before_its_handler_and_completed_after():
    journal = MemoryJournal()
    seen_status = []

    def send(_inp: Q, ctx: ToolContext) -> str:
        seen_status.append(journal.records[ctx.tool_use_id].status)
        return "sent"

    tools = [tool("send", "Send.", Q, send), tool("look", "Look.", Q, lambda i: "seen", effect="read_only")]
    result, _ = await run_one(tools, [("send", {}, "s1"), ("look", {}, "l1")], journal)
    assert result.subtype == "success"
    assert seen_status == ["started"]
    assert journal.log == [("started", "s1"), ("completed", "s1"), ("started", "l1"), ("completed", "l1")]
    record = journal.records["s1"]
    assert record.status == "completed" and record.effect_key == "wi-1:s1"
    assert record.block == {"type": "tool_result", "tool_use_id": "s1", "content": "sent"}


async def test_a_completed_call_never_runs_again():
    provider = Provider()
    journal = MemoryJournal()
    send = tool("send", "Send.", Q, provider.handler("send"))
    finish = tool(
        "finish", "Finish.", Q, lambda i: ToolResult("final", end_turn=True, structured_result={"n": 1})
    )
    await run_one([send, finish], [("send", {}, "s1")], journal)
    assert provider.effects == ["send"]
    # the same turn replayed after a crash: the recorded result is used
    _, history = await run_one([send, finish], [("send", {}, "s1")], journal)
    assert provider.effects == ["send"]
    assert history[2]["content"] == [{"type": "tool_result", "tool_use_id": "s1", "content": "send done"}]

    # an end_turn result replays as an end_turn result
    journal2 = MemoryJournal()
    first, _ = await run_one([send, finish], [("finish", {}, "f1")], journal2)
    again, _ = await run_one([send, finish], [("finish", {}, "f1")], journal2)
    assert first.result == again.result == "final"
    assert again.structured_result == {"n": 1}


async def test_an_interrupted_read_only_call_runs_again():
    provider = Provider()
    journal = MemoryJournal()
    journal.interrupted("r1", key="wi-1:r1", age_s=3600)
    look = tool("look", "Look.", Q, provider.handler("look"), effect="read_only")
    result, _ = await run_one([look], [("look", {}, "r1")], journal)
    assert result.subtype == "success" and provider.effects == ["look"]


async def test_an_interrupted_idempotent_call_is_resent_with_the_same_key_inside_its_window():
    provider = Provider()
    journal = MemoryJournal()
    journal.interrupted("c1", key="wi-1:c1", age_s=10)
    first_start = journal.records["c1"].started_at_ms
    charge = tool("charge", "Charge.", Q, provider.handler("charge"), effect="idempotent", dedup_window_s=60)
    result, _ = await run_one([charge], [("charge", {}, "c1")], journal)
    assert result.subtype == "success"
    assert provider.keys == ["wi-1:c1"]
    assert journal.records["c1"].status == "completed"
    assert journal.records["c1"].started_at_ms == first_start  # the window runs from the first request


async def test_an_interrupted_idempotent_call_parks_after_its_window():
    provider = Provider()
    journal = MemoryJournal()
    journal.interrupted("c1", key="wi-1:c1", age_s=120)
    charge = tool("charge", "Charge.", Q, provider.handler("charge"), effect="idempotent", dedup_window_s=60)
    result, history = await run_one([charge], [("charge", {}, "c1")], journal)
    assert result.subtype == "suspended"
    assert provider.effects == []
    [(tid, reason)] = journal.parked
    assert tid == "c1" and "dedup window (60 s) passed" in reason
    assert history[-1]["role"] == "assistant"


@pytest.mark.parametrize(
    ("answer", "finality", "outcome"),
    [
        (LookupFound("ch_42"), "final", "use"),
        ({"status": "found", "value": "ch_42"}, "nonfinal", "use"),
        (LookupNotFound(), "final", "run"),
        (LookupNotFound(), "nonfinal", "park"),
        (LookupUnknown("provider timed out"), "final", "park"),
        (RuntimeError("lookup broke"), "final", "park"),
    ],
)
async def test_an_interrupted_reconcilable_call_asks_its_lookup(answer, finality, outcome):
    provider = Provider()
    asked: list[str] = []

    async def lookup(key: str):
        asked.append(key)
        if isinstance(answer, Exception):
            raise answer
        return answer

    journal = MemoryJournal()
    journal.interrupted("c1", key="wi-1:c1")
    charge = tool(
        "charge",
        "Charge.",
        Q,
        provider.handler("charge"),
        effect="reconcilable",
        reconcile=Reconcile(lookup, finality=finality),
    )
    result, history = await run_one([charge], [("charge", {}, "c1")], journal)
    assert asked == ["wi-1:c1"]
    if outcome == "use":
        assert provider.effects == []
        assert history[2]["content"] == [{"type": "tool_result", "tool_use_id": "c1", "content": "ch_42"}]
        assert journal.records["c1"].status == "completed"
    elif outcome == "run":
        assert provider.effects == ["charge"] and provider.keys == ["wi-1:c1"]
        assert result.subtype == "success"
    else:
        assert provider.effects == [] and result.subtype == "suspended"
        assert len(journal.parked) == 1


async def test_an_interrupted_unguarded_call_parks_and_the_calls_before_it_keep_their_results():
    provider = Provider()
    journal = MemoryJournal()
    look = tool("look", "Look.", Q, provider.handler("look"), effect="read_only")
    send = tool("send", "Send.", Q, provider.handler("send"))
    journal.interrupted("s1", key="wi-1:s1")
    result, history = await run_one(
        [look, send], [("look", {}, "l1"), ("send", {}, "s1"), ("look", {}, "l2")], journal
    )
    assert result.subtype == "suspended"
    assert provider.effects == ["look"]  # the read before it ran, nothing after it started
    assert journal.records["l1"].status == "completed"
    assert "l2" not in journal.records
    [(tid, reason)] = journal.parked
    assert tid == "s1" and reason.startswith("unguarded")

    # a person resolves the call with a result (what `lattice resolve --result` records)
    journal.records["s1"] = JournalRecord(
        "s1",
        "completed",
        "wi-1:s1",
        journal.records["s1"].started_at_ms,
        block={"type": "tool_result", "tool_use_id": "s1", "content": "resolved by hand"},
    )
    result, history = await run_one(
        [look, send], [("look", {}, "l1"), ("send", {}, "s1"), ("look", {}, "l2")], journal
    )
    assert result.subtype == "success"
    assert provider.effects == ["look", "look"]  # l1 was not run again, send never ran, l2 ran once
    assert [b["content"] for b in history[2]["content"]] == ["look done", "resolved by hand", "look done"]


async def test_a_suspension_from_the_journal_is_not_an_error_result():
    class Refusing(MemoryJournal):
        async def started(self, call: JournalCall) -> None:
            raise SuspendQuery("the store says wait")

    provider = Provider()
    send = tool("send", "Send.", Q, provider.handler("send"))
    result, history = await run_one([send], [("send", {}, "s1")], Refusing())
    assert result.subtype == "suspended" and provider.effects == []
    assert history[-1]["role"] == "assistant"
