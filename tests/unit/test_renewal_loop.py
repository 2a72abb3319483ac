"""RenewalLoop: renews while its block runs, stops when it ends or a renewal says so."""

from __future__ import annotations

import asyncio

from lattice_worker.runtime.run.renewal import RenewalLoop


class Counting(RenewalLoop):
    def __init__(self, lease_s: float, *, stop_after: int | None = None) -> None:
        super().__init__(lease_s, "test-renewals")
        self.calls = 0
        self.stop_after = stop_after

    async def renew_once(self) -> bool:
        self.calls += 1
        self.renewals += 1
        return self.stop_after is None or self.calls < self.stop_after


async def wait_until(predicate, limit: float = 5.0) -> None:
    for _ in range(int(limit / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_renews_while_the_block_runs_and_not_after():
    loop = Counting(0.03)  # a renewal every 10 ms
    async with loop:
        await wait_until(lambda: loop.calls >= 3)
    done = loop.calls
    await asyncio.sleep(0.05)
    assert loop.calls == done  # nothing renews after the block


async def test_a_block_that_ends_at_once_renews_nothing():
    loop = Counting(30)
    async with loop:
        pass
    await asyncio.sleep(0)
    assert loop.calls == 0


async def test_a_refused_renewal_stops_the_loop():
    loop = Counting(0.03, stop_after=2)
    async with loop:
        await wait_until(lambda: loop.calls >= 2)
        await asyncio.sleep(0.05)
        assert loop.calls == 2
