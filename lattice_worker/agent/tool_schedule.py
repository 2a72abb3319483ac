"""Running overlapping tool calls with their results recorded in call order.

A group of calls that may overlap (see :mod:`.tool_batch`) runs through
:func:`run_in_call_order`: calls start in call order, each only while fewer
than its cap are in flight, and a call stays "in flight" until it is
*recorded* -- which happens in call order, never in finishing order. So with
a cap of 8 the 9th call starts when the 1st is recorded, and a replay reads
the results in the order the model asked for them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .suspend import SuspendQuery

T = TypeVar("T")

MAX_CONCURRENT_CALLS = 8
"""At most this many calls of ``concurrent=True`` tools are in flight at once."""


async def run_in_call_order(
    count: int,
    cap_of: Callable[[int], int],
    run: Callable[[int], Awaitable[T]],
    record: Callable[[int, T], Any],
) -> None:
    """Run ``run(0) .. run(count - 1)`` overlapping, and ``record(i, result)``
    each in order ``0 .. count - 1``.

    ``cap_of(i)``: how many calls (``i`` included) may be in flight when ``i``
    starts (a positive int). A ``run`` that raises :class:`SuspendQuery` stops
    new starts; the calls already running are awaited first (their results
    are not recorded), then it propagates. Any other exception, or the caller's cancellation,
    cancels the calls still running and propagates.
    """
    running: deque[tuple[int, asyncio.Task[T]]] = deque()

    async def settle_oldest() -> None:
        index, task = running[0]
        result = await task
        running.popleft()
        record(index, result)

    try:
        for i in range(count):
            cap = max(1, cap_of(i))
            while len(running) >= cap:
                await settle_oldest()
            running.append((i, asyncio.ensure_future(run(i))))
        while running:
            await settle_oldest()
    except SuspendQuery:
        # The batch stops here: the calls already running settle (a journaling runtime
        # records them), nothing else starts, and no result of this batch is recorded.
        await asyncio.gather(*(task for _, task in running), return_exceptions=True)
        raise
    except BaseException:
        for _, task in running:
            task.cancel()
        await asyncio.gather(*(task for _, task in running), return_exceptions=True)
        raise


__all__ = ["MAX_CONCURRENT_CALLS", "run_in_call_order"]
