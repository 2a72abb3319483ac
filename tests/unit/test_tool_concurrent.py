"""concurrent=True read-only tools: overlap within one model response, at most
8 in flight, results recorded in call order, a tool with effects runs alone
(docs/tool-effects.md)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from lattice_worker import ScriptedModelClient, create_bare_agent, text_turn, tool, tool_turn
from lattice_worker.agent.tool_schedule import MAX_CONCURRENT_CALLS, run_in_call_order


class N(BaseModel):
    n: int


class Flight:
    """Counts handlers in flight; each waits for its release event."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.log: list[str] = []
        self.release: dict[str, asyncio.Event] = {}

    def event(self, label: str) -> asyncio.Event:
        return self.release.setdefault(label, asyncio.Event())

    def make(self, name: str, *, auto: bool = True, **options):
        async def handler(inp: N) -> str:
            label = f"{name}{inp.n}"
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.log.append(f"start:{label}")
            if auto:
                for _ in range(5):
                    await asyncio.sleep(0)
            else:
                await self.event(label).wait()
            self.log.append(f"end:{label}")
            self.active -= 1
            return label

        return tool(name, f"{name} tool", N, handler, **options)


async def run_batch(tools, calls, **options):
    client = ScriptedModelClient([tool_turn(*calls), text_turn("done")])
    agent = create_bare_agent(model_client=client, tools=tools, **options)
    result = await agent.prompt("go", stream=False)
    assert result.subtype == "success"
    history = await agent.get_history()
    return [b["content"] for b in history[2]["content"]], client


async def test_concurrent_calls_overlap_and_come_back_in_call_order():
    f = Flight()
    search = f.make("search", effect="read_only", concurrent=True)
    contents, _ = await run_batch([search], [("search", {"n": i}) for i in range(5)])
    assert contents == [f"search{i}" for i in range(5)]
    assert f.peak == 5
    assert f.log[:5] == [f"start:search{i}" for i in range(5)]  # all started before any ended


async def test_at_most_eight_concurrent_calls_are_in_flight():
    f = Flight()
    search = f.make("search", effect="read_only", concurrent=True)
    contents, _ = await run_batch([search], [("search", {"n": i}) for i in range(20)])
    assert MAX_CONCURRENT_CALLS == 8
    assert f.peak == 8
    assert contents == [f"search{i}" for i in range(20)]

    # a smaller tool_concurrency.max_concurrency lowers the cap
    f2 = Flight()
    search2 = f2.make("search", effect="read_only", concurrent=True)
    await run_batch(
        [search2], [("search", {"n": i}) for i in range(6)], tool_concurrency={"max_concurrency": 3}
    )
    assert f2.peak == 3

    # mode "sequential" runs even concurrent tools one at a time
    f3 = Flight()
    search3 = f3.make("search", effect="read_only", concurrent=True)
    await run_batch(
        [search3], [("search", {"n": i}) for i in range(4)], tool_concurrency={"mode": "sequential"}
    )
    assert f3.peak == 1


async def test_the_ninth_call_starts_when_the_first_is_recorded_not_when_any_finishes():
    f = Flight()
    search = f.make("search", auto=False, effect="read_only", concurrent=True)
    client = ScriptedModelClient([tool_turn(*[("search", {"n": i}) for i in range(9)]), text_turn("done")])
    agent = create_bare_agent(model_client=client, tools=[search])
    task = asyncio.ensure_future(agent.prompt("go", stream=False))

    async def settle():
        for _ in range(20):
            await asyncio.sleep(0)

    await settle()
    assert f.active == 8 and "start:search8" not in f.log
    for i in range(1, 8):  # calls 2..8 finish: none of them is recorded before call 1
        f.event(f"search{i}").set()
    await settle()
    assert "start:search8" not in f.log
    f.event("search0").set()  # call 1 finishes and is recorded: the 9th starts
    await settle()
    assert "start:search8" in f.log
    f.event("search8").set()
    result = await asyncio.wait_for(task, 5)
    assert result.subtype == "success"
    history = await agent.get_history()
    assert [b["content"] for b in history[2]["content"]] == [f"search{i}" for i in range(9)]


async def test_a_tool_with_effects_runs_alone_between_concurrent_calls():
    f = Flight()
    search = f.make("search", effect="read_only", concurrent=True)
    send = f.make("send")  # unguarded
    charge = f.make("charge", effect="idempotent", dedup_window_s=60)
    calls = [
        ("search", {"n": 1}),
        ("search", {"n": 2}),
        ("send", {"n": 3}),
        ("search", {"n": 4}),
        ("charge", {"n": 5}),
        ("charge", {"n": 6}),
        ("search", {"n": 7}),
        ("search", {"n": 8}),
    ]
    contents, _ = await run_batch([search, send, charge], calls)
    log = f.log
    assert contents == ["search1", "search2", "send3", "search4", "charge5", "charge6", "search7", "search8"]
    # send starts after both earlier reads ended, and ends before anything later starts
    assert log.index("start:send3") > max(log.index("end:search1"), log.index("end:search2"))
    assert log.index("end:send3") < log.index("start:search4")
    for effectful in ("search4", "charge5", "charge6"):
        i = log.index(f"start:{effectful}")
        assert log[i + 1] == f"end:{effectful}"  # nothing else ran meanwhile
    assert log.index("start:search8") < log.index("end:search7")  # the last two reads overlapped
    assert f.peak == 2


async def test_a_read_only_tool_without_concurrent_runs_alone():
    f = Flight()
    read = f.make("read", effect="read_only")
    await run_batch([read], [("read", {"n": i}) for i in range(3)])
    assert f.peak == 1


async def test_run_in_call_order_records_in_order_and_respects_each_cap():
    order: list[int] = []
    active = 0
    peaks: dict[int, int] = {}

    async def run(i: int) -> int:
        nonlocal active
        active += 1
        peaks[i] = active
        await asyncio.sleep(0.001 * (5 - i % 5))  # later calls finish first
        active -= 1
        return i * 10

    await run_in_call_order(10, lambda i: 2 if i >= 5 else 4, run, lambda i, r: order.append(r))
    assert order == [i * 10 for i in range(10)]
    assert max(peaks[i] for i in range(5)) <= 4
    assert max(peaks[i] for i in range(5, 10)) <= 2
