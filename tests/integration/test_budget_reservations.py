"""The budget's reservation scripts (issue 22) against the real Redis and the
Redis Cluster: ``reserve_budget.lua`` says go / wait / reached, a reservation
is released by ``spend_budget.lua`` and one left by a crashed worker lapses."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lattice_client.errors import RunNotFoundError
from lattice_client.runstore import RunStore
from lattice_client.runstore.budgets import reserve_reply
from tests.support.runstore import run_call

STATE_STORES = ("redis", "cluster")
"""Every test runs on the tests' Redis and on the session's Redis Cluster."""

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


async def reserve(
    store: RunStore, run_id: str, call_id: str, estimate: int = 0, hold_ms: int = 60_000
) -> Any:
    return reserve_reply(await run_call(store, store.reserve_call(run_id, call_id, estimate, hold_ms)))


async def test_calls_reserve_until_the_budget_is_full_then_wait_then_one_goes_alone(store):
    await store.create("run-b", "team", "p", budget_tokens=1_000)
    await run_call(store, store.spend_call("run-b", 300))  # the run's largest call: 300
    outcome, spent, budget, a = await reserve(store, "run-b", "a", estimate=10)  # 300 + 300 <= 1000
    assert (outcome, spent, budget) == ("go", 300, 1_000) and a == "a|300"
    _, _, _, b = await reserve(store, "run-b", "b")  # 300 + 300 + 300 <= 1000
    assert b == "b|300"
    outcome, _, _, ms = await reserve(store, "run-b", "c", estimate=50)  # 300 + 600 + 300 > 1000
    assert outcome == "wait" and 0 < ms <= 60_000
    # a's call lands (its own size: 350, the new largest); c still does not fit beside b
    assert await run_call(store, store.spend_call("run-b", 350, a)) == [650, 1_000]
    assert (await reserve(store, "run-b", "c"))[0] == "wait"  # 650 + 300 + 350 > 1000
    await run_call(store, store.spend_call("run-b", 300, b))  # 950: nothing in flight
    outcome, spent, _, c = await reserve(store, "run-b", "c")  # alone: it may go past
    assert (outcome, spent, c) == ("go", 950, "c|350")
    assert (await reserve(store, "run-b", "d"))[0] == "wait"  # not while c is in flight
    await run_call(store, store.spend_call("run-b", 350, c))
    assert await reserve(store, "run-b", "d") == ("reached", 1_300, 1_000, "")


async def test_a_crashed_workers_reservation_lapses(store):
    await store.create("run-c", "team", "p", budget_tokens=1_000)
    await run_call(store, store.spend_call("run-c", 600))
    outcome, _, _, _ = await reserve(store, "run-c", "crashed", hold_ms=300)  # never released
    assert outcome == "go"
    outcome, _, _, ms = await reserve(store, "run-c", "next")
    assert outcome == "wait" and ms <= 300
    await asyncio.sleep(ms / 1000 + 0.05)
    assert (await reserve(store, "run-c", "next"))[0] == "go"  # the lapsed one no longer counts


async def test_a_run_without_a_budget_reserves_nothing_and_an_unknown_run_is_refused(store, raw, prefix):
    await store.create("run-n", "team", "p")
    assert await reserve(store, "run-n", "a", estimate=100) == ("go", 0, -1, "")
    assert not raw.exists(store.budget_calls_key("run-n"))
    with pytest.raises(RunNotFoundError):
        await reserve(store, "run-nope", "a")


async def test_a_renewed_reservation_outlives_its_first_hold_and_a_lapsed_one_comes_back(store):
    await store.create("run-r", "team", "p", budget_tokens=1_000)
    await run_call(store, store.spend_call("run-r", 600))
    _, _, _, held = await reserve(store, "run-r", "slow", hold_ms=300)
    assert await run_call(store, store.renew_call("run-r", held, 60_000)) == 1
    await asyncio.sleep(0.4)  # past its first hold: still reserved
    assert (await reserve(store, "run-r", "next"))[0] == "wait"
    await run_call(store, store.spend_call("run-r", 0, held))  # gone, as a lapsed one is
    assert await run_call(store, store.renew_call("run-r", held, 60_000)) == 0  # added back
    assert (await reserve(store, "run-r", "next"))[0] == "wait"
