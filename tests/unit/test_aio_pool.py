"""The asyncio pool's greenlet bridge and the pool itself, driven as Celery's consumer drives it.

``AsyncioPool.on_apply`` gets what Celery's worker gives every pool (the
tracer, its arguments, the accept / result callbacks); these tests call it
the same way with plain functions and check what the callbacks receive, that
many tasks wait at once on one loop, and that errors go where Celery expects
them. A real worker on this pool runs in tests/e2e/test_default_pool.py.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Any

import pytest

from lattice_worker.runtime.worker import aio_pool, loops, tasks
from lattice_worker.runtime.worker.aio_pool import (
    AsyncioPool,
    await_coroutine,
    in_task_greenlet,
    run_in_greenlet,
)
from lattice_worker.tools.tool import tool
from lattice_worker.tools.tool_definition import in_handler_thread, sync_handlers_in_threads


async def test_a_task_greenlet_awaits_coroutines_and_gets_their_results_and_errors():
    async def double(x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    async def boom() -> None:
        raise KeyError("inner")

    def task(x: int) -> tuple[int, str, bool]:
        first = await_coroutine(double(x))
        try:
            await_coroutine(boom())
        except KeyError as exc:
            caught = str(exc)
        return first, caught, in_task_greenlet()

    assert await run_in_greenlet(task, 21) == (42, "'inner'", True)
    assert not in_task_greenlet()


async def test_an_error_of_the_task_itself_reaches_the_caller():
    def task() -> None:
        await_coroutine(asyncio.sleep(0))
        raise ValueError("outer")

    with pytest.raises(ValueError, match="outer"):
        await run_in_greenlet(task)


def test_await_coroutine_outside_a_task_greenlet_is_refused():
    async def nothing() -> None:
        return None

    coro = nothing()
    with pytest.raises(RuntimeError, match="outside an AsyncioPool task"):
        await_coroutine(coro)
    coro.close()


async def test_loops_run_inside_a_task_greenlet_uses_the_running_loop():
    outer = asyncio.get_running_loop()

    async def which() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert await run_in_greenlet(lambda: loops.run(which())) is outer


@pytest.fixture
def pool():
    p = AsyncioPool(limit=50)
    p.start()
    yield p
    p.stop()


def _apply(pool: AsyncioPool, target: Any, *args: Any) -> tuple[threading.Event, dict[str, Any]]:
    done = threading.Event()
    seen: dict[str, Any] = {}

    def accepted(pid: int, when: float) -> None:
        seen["accepted"] = (pid, threading.current_thread().name)

    def callback(value: Any) -> None:
        seen["value"] = value
        done.set()

    pool.apply_async(target, args=args, callback=callback, accept_callback=accepted)
    return done, seen


def test_fifty_tasks_wait_on_the_pool_loop_at_once(pool):
    def task(i: int) -> int:
        # a step: its coroutine waits 0.5 s; the task greenlet waits for it
        return loops.run(_sleep_then(0.5, i))

    t0 = time.monotonic()
    applied = [_apply(pool, task, i) for i in range(50)]
    assert all(done.wait(10) for done, _ in applied)
    assert time.monotonic() - t0 < 3  # not 50 x 0.5 s: they waited together
    assert [seen["value"] for _, seen in applied] == list(range(50))
    assert {seen["accepted"][1] for _, seen in applied} == {"lattice-asyncio-pool"}
    assert pool.info["max-concurrency"] == 50


async def _sleep_then(seconds: float, value: int) -> int:
    await asyncio.sleep(seconds)
    return value


def test_a_task_that_raises_hands_the_error_to_celerys_wrapper_not_the_callback(pool):
    # Celery's tracer catches task errors itself; what escapes apply_target is re-raised
    def task() -> None:
        raise RuntimeError("escaped")

    done = threading.Event()
    result = pool.apply_async(task, callback=lambda value: done.set())
    with pytest.raises(RuntimeError, match="escaped"):
        result.get(timeout=5)
    assert not done.is_set()


def test_stop_waits_for_running_tasks_then_stops_the_loop():
    p = AsyncioPool(limit=4)
    p.start()
    done, seen = _apply(p, lambda: loops.run(_sleep_then(0.3, 7)))
    time.sleep(0.05)
    p.stop()
    assert done.is_set() and seen["value"] == 7
    assert p.loop is None and not aio_pool.in_pool_loop()


async def test_a_plain_tool_handler_runs_in_a_thread_when_the_runtime_asks():
    from lattice_worker.tools.tool_result import ToolContext

    where: list[str] = []

    @tool
    def blocking(x: int) -> str:
        """Block for a moment."""
        where.append(threading.current_thread().name)
        time.sleep(0.2)
        return str(x)

    @tool
    async def quick(x: int) -> str:
        """Answer at once."""
        where.append(threading.current_thread().name)
        return str(x)

    ctx = ToolContext(tool_use_id="t1", tool_name="blocking")
    loop_thread = threading.current_thread().name
    # default (in-process agents): on the loop
    assert (await blocking.invoke(blocking.parse_input({"x": 1}), ctx)).content == "1"
    assert where.pop() == loop_thread
    token = sync_handlers_in_threads.set(True)
    try:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        assert (await blocking.invoke(blocking.parse_input({"x": 2}), ctx)).content == "2"
        ticker.cancel()
        assert where.pop() != loop_thread
        assert ticks >= 5  # the loop kept running while the handler blocked
        assert (await quick.invoke(quick.parse_input({"x": 3}), ctx)).content == "3"
        assert where.pop() == loop_thread  # async handlers stay on the loop
    finally:
        sync_handlers_in_threads.reset(token)


def test_a_system_exit_in_a_steps_task_does_not_stop_the_pool_loop(pool):
    # asyncio lets SystemExit / KeyboardInterrupt out of run_forever: the loop must go on
    async def spawns_a_failing_task() -> str:
        async def argparse_like() -> None:
            raise SystemExit(2)

        inner = asyncio.ensure_future(argparse_like())
        try:
            await inner
        except SystemExit:
            return "caught"
        return "not reached"

    first, seen_first = _apply(pool, lambda: loops.run(spawns_a_failing_task()))
    assert first.wait(10) and seen_first["value"] == "caught"
    later, seen_later = _apply(pool, lambda: loops.run(_sleep_then(0.01, 5)))
    assert later.wait(10) and seen_later["value"] == 5
    assert pool._thread.is_alive()


async def test_a_steps_coroutine_sees_the_context_its_task_greenlet_set():
    # what a Celery task_prerun receiver sets in the task's context reaches the step
    var: contextvars.ContextVar[str] = contextvars.ContextVar("set_by_a_signal", default="unset")

    async def read() -> str:
        return var.get()

    def task() -> str:
        var.set("task-context")
        return loops.run(read())

    assert await run_in_greenlet(task) == "task-context"
    assert var.get() == "unset"


def test_steps_plain_tool_handlers_run_on_the_pools_own_tool_threads(monkeypatch):
    # A pool with ONE step in flight: its step still runs its concurrent calls together
    # (two handlers meet at a barrier), on the pool's tool threads; while they block, the
    # loop's default executor -- its DNS lookups, the SQL mailboxes' calls -- serves at once.
    pool = AsyncioPool(limit=1)
    pool.start()
    barrier = threading.Barrier(2, timeout=5)
    release = threading.Event()
    names: list[str] = []

    @tool
    def meet(x: int) -> str:
        """Wait for the other call, then until released."""
        names.append(threading.current_thread().name)
        barrier.wait()
        release.wait(10)
        return str(x)

    class _Ctx:  # what run_step touches of a WorkerContext
        class writer:  # noqa: N801
            @staticmethod
            async def flush() -> None:
                return None

    async def body(ctx: Any, arg: str) -> str:
        calls = [meet.invoke(meet.parse_input({"x": i}), None) for i in range(2)]  # type: ignore[arg-type]
        plain = in_handler_thread(lambda: threading.current_thread().name)  # a built-in tool's blocking part
        results = await asyncio.gather(*calls, plain)
        return ",".join(str(getattr(r, "content", r)) for r in results)

    monkeypatch.setitem(tasks._BODIES, "test.meet", body)
    try:
        assert aio_pool.tool_executor() is None  # off the pool loop
        step = asyncio.run_coroutine_threadsafe(tasks.run_step(_Ctx(), "test.meet", "x"), pool.loop)
        deadline = time.monotonic() + 5
        while len(names) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(names) == 2 and all(name.startswith("lattice-tool") for name in names)

        async def default_executor() -> str:
            return await asyncio.to_thread(lambda: threading.current_thread().name)

        other = asyncio.run_coroutine_threadsafe(default_executor(), pool.loop).result(timeout=2)
        assert other.startswith("lattice-blocking")
        release.set()
        first, second, plain_thread = step.result(timeout=5).split(",")
        assert (first, second) == ("0", "1") and plain_thread.startswith("lattice-tool")
    finally:
        release.set()
        pool.stop()
