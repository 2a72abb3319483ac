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


def make_theirs() -> Side:
    """One (stateless) openai-agents Agent reused for every run, the canned model."""
    from agents import Agent, ModelResponse, RunConfig, Runner, Usage, function_tool, set_tracing_disabled
    from agents.models.interface import Model
    from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

    set_tracing_disabled(True)
    calls = 0

    @function_tool
    async def add(a: int, b: int) -> str:
        """Add two integers."""
        # async like ours: openai-agents runs a sync function tool in a worker thread
        # (asyncio.to_thread), a cost our side (an async handler) would not pay.
        nonlocal calls
        calls += 1
        return str(a + b)

    class CannedModel(Model):
        """Zero-latency model: the turn number is the count of tool calls answered so far."""

        async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
            turn = sum(
                1 for item in input if isinstance(item, dict) and item.get("type") == "function_call_output"
            )
            if turn < TOOL_TURNS:
                output: list[Any] = [
                    ResponseFunctionToolCall(
                        id=f"fc_{turn:04d}",
                        call_id=f"call_{turn:04d}",
                        name="add",
                        arguments=f'{{"a": {turn}, "b": 1}}',
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

    agent = Agent(name="bench", instructions="Add numbers.", tools=[add], model=CannedModel())
    config = RunConfig(tracing_disabled=True)

    async def run() -> Any:
        return await Runner.run(agent, "go", max_turns=50, run_config=config)

    def check(result: Any) -> int:
        nonlocal calls
        if result.final_output != FINAL_TEXT:
            raise RuntimeError(f"openai-agents: unexpected final output {result.final_output!r}")
        made, calls = calls, 0
        return made

    return Side(lambda: None, run, check)


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
    return 0


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
