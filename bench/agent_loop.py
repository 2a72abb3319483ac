"""Agent-loop overhead per model turn, ours against openai-agents, in one run.

Workload (identical on both sides): one run = 20 model turns that each call one
tool (``add(a, b)``, validated by pydantic on both sides) and a 21st turn that
answers with text. The model answers instantly from memory (no network, no
sleep), so what is measured is the loop itself: request assembly, response
handling, tool dispatch and input validation, history bookkeeping, events.

* ours: ``create_bare_agent(model_client=ScriptedModelClient(fn), tools=[add])``,
  ``await agent.prompt("go", stream=False)``; a fresh Agent (and client) per run,
  created inside the timed region, tracing off (no tracer configured).
* theirs: ``openai-agents`` ``Runner.run(agent, "go", max_turns=50)`` with an
  ``agents.models.interface.Model`` that returns canned ``ModelResponse`` items
  and tracing disabled (globally and in the ``RunConfig``).

Both tools are ``async`` functions (openai-agents would run a sync function tool
in a worker thread), both models compute the turn number the same way (a scan
of the request's history), neither side sleeps or logs.

Both sides run on the same event loop, interleaved run by run (so machine
drift hits both equally), after a warm-up. Printed: the median per-turn cost of
each in **microseconds** (run time / 21 turns) and the ratio ours / theirs
(target: <= 1.0). Every run's outcome is checked (20 tool calls, final text
"done"); a wrong outcome exits with status 1.

A second figure (:func:`read_figure`) runs a 20-turn loop whose every tool turn
reads a real file with the built-in ``Read`` tool, against openai-agents on the
same loop shape with an equivalent read function tool, and against our own
``add`` loop; it uses a quarter of ``--runs`` / ``--warmup``.

Run: ``python bench/agent_loop.py [--runs N] [--warmup N]`` (needs the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

TOOL_TURNS = 20
MODEL_TURNS = TOOL_TURNS + 1
FINAL_TEXT = "done"


@dataclass
class Side:
    """One contender: ``prepare()`` (untimed) sets up a run, ``run()`` (timed) plays it,
    ``check(result)`` validates the outcome and returns the tool calls the run made."""

    prepare: Callable[[], None]
    run: Callable[[], Awaitable[Any]]
    check: Callable[[Any], int]


# -- ours ------------------------------------------------------------------------------------------


def make_ours() -> Side:
    """A fresh bare Agent per run (built in ``prepare``), the stateless scripted model."""
    from pydantic import BaseModel

    from lattice_worker import ScriptedModelClient, create_bare_agent, tool
    from lattice_worker.agent.model import AssistantModelMessage

    class AddInput(BaseModel):
        a: int
        b: int

    calls = 0

    async def add(args: AddInput) -> str:
        nonlocal calls
        calls += 1
        return str(args.a + args.b)

    add_tool = tool("add", "Add two integers.", AddInput, add)

    def respond(request: Any) -> AssistantModelMessage:
        # Stateless: the turn number is the count of assistant messages so far.
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        if turn < TOOL_TURNS:
            block = {
                "type": "tool_use",
                "id": f"toolu_{turn:04d}",
                "name": "add",
                "input": {"a": turn, "b": 1},
            }
            return AssistantModelMessage(content=[block], stop_reason="tool_use")
        return AssistantModelMessage(content=[{"type": "text", "text": FINAL_TEXT}], stop_reason="end_turn")

    def prepare() -> None:
        pass

    async def run() -> Any:
        # Agent and client are built inside the timed region: Runner.run builds its
        # per-run state inside it too. A fresh client per run keeps its request log
        # (ScriptedModelClient.requests) from growing over the whole benchmark.
        agent = create_bare_agent(model_client=ScriptedModelClient(respond), tools=[add_tool], max_turns=50)
        return await agent.prompt("go", stream=False)

    def check(result: Any) -> int:
        nonlocal calls
        text = getattr(result, "result", None)
        if getattr(result, "subtype", None) != "success" or text != FINAL_TEXT:
            raise RuntimeError(f"ours: unexpected result {result!r}")
        made, calls = calls, 0
        return made

    return Side(prepare, run, check)


# -- theirs (openai-agents) ------------------------------------------------------------------------


def canned_model(tool_name: str, arguments: Callable[[int], str]) -> Any:
    """A zero-latency openai-agents ``Model``: ``TOOL_TURNS`` calls of ``tool_name``
    (``arguments(turn)`` as JSON), then the final text. The turn number is the count
    of tool calls answered so far."""
    from agents import ModelResponse, Usage
    from agents.models.interface import Model
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    class CannedModel(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            turn = sum(
                1 for item in input if isinstance(item, dict) and item.get("type") == "function_call_output"
            )
            if turn < TOOL_TURNS:
                output: list[Any] = [
                    ResponseFunctionToolCall(
                        id=f"fc_{turn:04d}",
                        call_id=f"call_{turn:04d}",
                        name=tool_name,
                        arguments=arguments(turn),
                        type="function_call",
                        status="completed",
                    )
                ]
            else:
                output = [
                    ResponseOutputMessage(
                        id="msg_final",
                        content=[ResponseOutputText(text=FINAL_TEXT, type="output_text", annotations=[])],
                        role="assistant",
                        status="completed",
                        type="message",
                    )
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            raise NotImplementedError("the benchmark runs non-streamed")

    return CannedModel()


def openai_agents_side(tool: Any, model: Any, instructions: str, take_calls: Callable[[], int]) -> Side:
    """One (stateless) openai-agents Agent reused for every run; ``take_calls()``
    returns (and resets) how many tool calls the run made."""
    from agents import Agent, RunConfig, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    agent = Agent(name="bench", instructions=instructions, tools=[tool], model=model)
    config = RunConfig(tracing_disabled=True)

    async def run() -> Any:
        return await Runner.run(agent, "go", max_turns=50, run_config=config)

    def check(result: Any) -> int:
        if result.final_output != FINAL_TEXT:
            raise RuntimeError(f"openai-agents: unexpected final output {result.final_output!r}")
        return take_calls()

    return Side(lambda: None, run, check)


def make_theirs() -> Side:
    """openai-agents with an ``add`` function tool and the canned model."""
    from agents import function_tool

    calls = 0

    @function_tool
    async def add(a: int, b: int) -> str:
        """Add two integers."""
        # async like ours: openai-agents runs a sync function tool in a worker thread
        # (asyncio.to_thread), a cost our side (an async handler) would not pay.
        nonlocal calls
        calls += 1
        return str(a + b)

    def take() -> int:
        nonlocal calls
        made, calls = calls, 0
        return made

    model = canned_model("add", lambda turn: f'{{"a": {turn}, "b": 1}}')
    return openai_agents_side(add, model, "Add numbers.", take)


# -- measurement -----------------------------------------------------------------------------------


async def timed(side: Side) -> int:
    """One run; returns its duration in nanoseconds."""
    side.prepare()
    start = time.perf_counter_ns()
    result = await side.run()
    elapsed = time.perf_counter_ns() - start
    made = side.check(result)
    if made != TOOL_TURNS:
        raise RuntimeError(f"expected {TOOL_TURNS} tool calls per run, got {made}")
    return elapsed


async def main(runs: int, warmup: int) -> int:
    ours, theirs = make_ours(), make_theirs()
    for _ in range(warmup):
        await timed(ours)
        await timed(theirs)
    ours_ns: list[int] = []
    theirs_ns: list[int] = []
    gc.collect()
    for i in range(runs):
        # Alternate who goes first so neither side always runs right after the other's garbage.
        if i % 2 == 0:
            ours_ns.append(await timed(ours))
            theirs_ns.append(await timed(theirs))
        else:
            theirs_ns.append(await timed(theirs))
            ours_ns.append(await timed(ours))

    ours_turn_us = statistics.median(ours_ns) / MODEL_TURNS / 1000
    theirs_turn_us = statistics.median(theirs_ns) / MODEL_TURNS / 1000
    ratio = ours_turn_us / theirs_turn_us
    print(
        f"agent loop: {TOOL_TURNS} tool turns + 1 final turn, zero-latency model, {runs} runs each (median)"
    )
    print(f"  agent-lattice  Agent.prompt (ScriptedModelClient)  {ours_turn_us:10.1f} us/turn")
    print(f"  openai-agents  Runner.run (canned Model)           {theirs_turn_us:10.1f} us/turn")
    print(f"  ratio ours/theirs: {ratio:.2f}  (target <= 1.0: {'met' if ratio <= 1.0 else 'NOT met'})")
    await read_figure(max(1, runs // 4), max(1, warmup // 4))
    return 0


# -- second figure: a 20-turn loop on the built-in Read tool -------------------------------------

READ_LINES = 100


def make_read_file(directory: str) -> str:
    """A real text file of ``READ_LINES`` lines (~5 KB) for the Read loop."""
    import os

    path = os.path.join(directory, "data.txt")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(1, READ_LINES + 1):
            f.write(f"line {i:04d}: the quick brown fox jumps over the lazy dog\n")
    return path


def numbered(path: str) -> str:
    """What openai-agents' read tool answers: the file as ``cat -n`` lines, like ours."""
    with open(path, encoding="utf-8") as f:
        return "\n".join(f"{n:>6}\t{line.rstrip()}" for n, line in enumerate(f, start=1))


def make_ours_read(path: str) -> Side:
    """A fresh bare Agent per run with ``create_builtin_tools``; every tool turn calls
    ``Read {file_path}`` on the real file (relative to the tools' cwd)."""
    import os

    from lattice_worker import ScriptedModelClient, create_bare_agent, create_builtin_tools
    from lattice_worker.agent.model import AssistantModelMessage

    tools = create_builtin_tools(cwd=os.path.dirname(path))
    results: list[str] = []

    def respond(request: Any) -> AssistantModelMessage:
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        if turn:
            results.append(request.messages[-1]["content"][0]["content"])
        if turn < TOOL_TURNS:
            block = {
                "type": "tool_use",
                "id": f"toolu_{turn:04d}",
                "name": "Read",
                "input": {"file_path": "data.txt"},
            }
            return AssistantModelMessage(content=[block], stop_reason="tool_use")
        return AssistantModelMessage(content=[{"type": "text", "text": FINAL_TEXT}], stop_reason="end_turn")

    async def run() -> Any:
        agent = create_bare_agent(model_client=ScriptedModelClient(respond), tools=tools, max_turns=50)
        return await agent.prompt("go", stream=False)

    def check(result: Any) -> int:
        if getattr(result, "subtype", None) != "success" or result.result != FINAL_TEXT:
            raise RuntimeError(f"ours (Read): unexpected result {result!r}")
        expected = numbered(path)
        if any(r != expected for r in results):
            raise RuntimeError("ours (Read): a Read result differs from the file")
        made = len(results)
        results.clear()
        return made

    return Side(lambda: None, run, check)


def make_theirs_read(path: str) -> Side:
    """openai-agents on the same loop shape: a ``read`` function tool returning the
    same numbered text, reading in a worker thread like our Read does."""
    from agents import function_tool

    calls = 0
    expected = numbered(path)

    @function_tool
    async def read(file_path: str) -> str:
        """Read a text file as numbered lines."""
        nonlocal calls
        text = await asyncio.to_thread(numbered, path if file_path == "data.txt" else file_path)
        if text == expected:
            calls += 1
        return text

    def take() -> int:
        nonlocal calls
        made, calls = calls, 0
        return made

    model = canned_model("read", lambda turn: '{"file_path": "data.txt"}')
    return openai_agents_side(read, model, "Read files.", take)


async def read_figure(runs: int, warmup: int) -> None:
    """Second figure: per-turn cost of a 20-turn loop whose every tool turn reads a
    real ~5 KB file with the built-in Read tool, against openai-agents running the
    same loop with an equivalent read function tool, and against our own loop on
    the trivial ``add`` tool (what the Read tool itself adds per turn)."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = make_read_file(directory)
        sides = {"ours": make_ours_read(path), "theirs": make_theirs_read(path), "add": make_ours()}
        for _ in range(warmup):
            for side in sides.values():
                await timed(side)
        samples: dict[str, list[int]] = {name: [] for name in sides}
        gc.collect()
        order = list(sides)
        for i in range(runs):
            for name in order[i % 3 :] + order[: i % 3]:  # rotate who goes first
                samples[name].append(await timed(sides[name]))
    us = {name: statistics.median(values) / MODEL_TURNS / 1000 for name, values in samples.items()}
    print()
    print(
        f"built-in Read loop: {TOOL_TURNS} Read turns on a real {READ_LINES}-line file + 1 final turn, {runs} runs"
    )
    print(f"  agent-lattice  built-in Read                      {us['ours']:10.1f} us/turn")
    print(f"  openai-agents  read function tool (same file)     {us['theirs']:10.1f} us/turn")
    print(f"  agent-lattice  add tool (no file work)            {us['add']:10.1f} us/turn")
    print(f"  ratio ours/openai-agents: {us['ours'] / us['theirs']:.2f}")
    print(f"  ratio Read loop / add loop (ours): {us['ours'] / us['add']:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="measured runs per side (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured runs per side first (default 20)")
    args = parser.parse_args()
    if args.runs < 1 or args.warmup < 0:
        parser.error("--runs must be >= 1 and --warmup >= 0")
    try:
        sys.exit(asyncio.run(main(args.runs, args.warmup)))
    except RuntimeError as exc:
        print(f"benchmark workload check failed: {exc}", file=sys.stderr)
        sys.exit(1)
