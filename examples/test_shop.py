"""Tests of the shop (examples/shop.py) as a trioq user writes them, with pytest_trioq.

Run with ``pytest examples/test_shop.py``. Every test runs in virtual time
(``autojump_clock``): a 5-second timeout or a 60-second backoff costs nothing.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

import trioq
from trioq.testing import FaultPlan, SimulatedCrash, assert_all_terminal, crash_points

import shop
from shop import place_order, registry

pytestmark = pytest.mark.trio


@pytest.fixture(autouse=True)
def fresh_shop(monkeypatch: pytest.MonkeyPatch) -> shop.Shop:
    state = shop.Shop()
    monkeypatch.setattr(shop, "shop", state)
    return state


async def test_charge_is_retried_after_gateway_errors(trioq_faults, trioq_open_queue, fresh_shop, autojump_clock):
    trioq_faults.fail("charge_order", times=2, error=ConnectionError("gateway unreachable"))
    async with trioq_open_queue(registry) as queue:
        job = await place_order(queue, "o-1", 1200)
        done = await queue.wait(job.id)
    assert done.state == "succeeded"
    assert done.attempts == 3
    assert fresh_shop.gateway.charges == {"o-1": 1200}


async def test_charge_is_idempotent(trioq_faults, trioq_open_queue, fresh_shop, autojump_clock):
    # The handler charges the card, then the worker dies before recording the
    # success: the job runs again, and the customer must not pay twice.
    trioq_faults.fail("charge_order", times=1, when="after")
    async with trioq_open_queue(registry) as queue:
        job = await place_order(queue, "o-2", 500)
        done = await queue.wait(job.id)
    assert done.state == "succeeded"
    assert fresh_shop.gateway.calls == 2  # the handler really ran twice
    assert fresh_shop.gateway.charges == {"o-2": 500}  # and charged once


async def test_hung_gateway_is_detected_and_retried(trioq_faults, trioq_open_queue, fresh_shop, autojump_clock):
    trioq_faults.hang("charge_order", times=1)
    started = trio.current_time()
    async with trioq_open_queue(registry) as queue:
        job = await place_order(queue, "o-3", 700)
        done = await queue.wait(job.id)
    assert done.state == "succeeded"
    assert done.attempts == 2
    assert trio.current_time() - started >= 5.0  # the first attempt ran into its 5 s timeout
    assert [fault.kind for fault in trioq_faults.injected] == ["hang"]


@pytest.mark.parametrize(("seconds", "attempts"), [(3.0, 1), (6.0, 2)])
async def test_slow_gateway(trioq_faults, trioq_open_queue, autojump_clock, seconds, attempts):
    # A slow dependency within the timeout is fine; past it, the attempt is retried.
    trioq_faults.delay("charge_order", seconds, times=1)
    async with trioq_open_queue(registry) as queue:
        job = await place_order(queue, "o-4", 100)
        done = await queue.wait(job.id)
    assert (done.state, done.attempts) == ("succeeded", attempts)


@pytest.mark.trioq_faults(fail=0.5, task="send_receipt", when="after")
async def test_every_order_gets_one_receipt(trioq_open_queue, fresh_shop, autojump_clock):
    # Half the receipt attempts "die" after sending: nobody gets two emails.
    async with trioq_open_queue(registry, workers=4) as queue:
        for n in range(20):
            await place_order(queue, f"o-{n}", 100 + n)
        await queue.join()
        await assert_all_terminal(queue)
    assert sorted(fresh_shop.receipts) == sorted(f"o-{n}" for n in range(20))


# A run of the scenario below writes 18 log records (a run without a crash
# leaves the count in trioq_faults.records): crash after each one of them.
@pytest.mark.parametrize("point", crash_points(18))
async def test_orders_survive_a_crash_at_any_point(
    tmp_path, trioq_faults: FaultPlan, trioq_open_queue, fresh_shop, autojump_clock, point
):
    # The queue dies like kill -9 after its `point`-th log record. Every order
    # whose charge was acknowledged must be charged exactly once after recovery.
    trioq_faults.crash(after_records=point)
    acknowledged = []
    with pytest.raises(SimulatedCrash):
        async with trioq_open_queue(registry, store=trioq.WALStore(tmp_path, fsync="always")) as queue:
            for n in range(3):
                job = await place_order(queue, f"o-{n}", 100)
                acknowledged.append(job.id)
            await queue.join()
    # Restart on the same directory, as a supervisor would (a crash strikes once).
    async with trioq_open_queue(registry, store=trioq.WALStore(tmp_path)) as queue:
        await queue.join()
        await assert_all_terminal(queue)
        for job_id in acknowledged:
            assert (await queue.get(job_id)).state == "succeeded"
    for n in range(len(acknowledged)):
        assert fresh_shop.gateway.charges[f"o-{n}"] == 100
    assert len(fresh_shop.receipts) == len(set(fresh_shop.receipts))  # never two receipts
