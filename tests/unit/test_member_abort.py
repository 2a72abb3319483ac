"""``until_aborted``: a member's work is cancelled a grace period after its
signal is aborted (claim lost, run cancelled), so a tool that ignores the
signal cannot hold the worker's slot (docs/architecture.md, "Crash")."""

from __future__ import annotations

import asyncio
import threading

import pytest

from lattice_worker.agent.abort import AbortController
from lattice_worker.runtime.member.lease import WorkAbandoned, until_aborted


async def test_work_that_ignores_the_abort_is_cancelled_after_the_grace():
    controller = AbortController()
    cancelled = asyncio.Event()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "finished"

    asyncio.get_running_loop().call_later(0.05, controller.abort, "the run was cancelled")
    with pytest.raises(WorkAbandoned) as caught:
        await asyncio.wait_for(until_aborted(stubborn(), controller.signal, grace_s=0.05), 10)
    assert caught.value.reason == "the run was cancelled"
    assert cancelled.is_set()


async def test_work_that_ends_within_the_grace_keeps_its_result():
    controller = AbortController()

    async def polite() -> str:
        await controller.signal.wait()
        await asyncio.sleep(0.01)
        return "stopped cleanly"

    asyncio.get_running_loop().call_later(0.02, controller.abort, "claim lost")
    assert await until_aborted(polite(), controller.signal, grace_s=5) == "stopped cleanly"


async def test_an_abort_from_another_thread_cancels_too():
    controller = AbortController()
    threading.Timer(0.05, controller.abort, args=("lost",)).start()
    with pytest.raises(WorkAbandoned):
        await asyncio.wait_for(until_aborted(asyncio.sleep(60), controller.signal, grace_s=0.01), 10)


async def test_no_abort_no_cancel_and_the_callers_cancel_propagates():
    controller = AbortController()
    assert await until_aborted(asyncio.sleep(0.01, result=7), controller.signal, grace_s=0) == 7
    inner_cancelled = asyncio.Event()

    async def long() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            inner_cancelled.set()
            raise

    outer = asyncio.ensure_future(until_aborted(long(), controller.signal))
    await asyncio.sleep(0.02)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):  # not WorkAbandoned: the caller cancelled
        await outer
    assert inner_cancelled.is_set()
