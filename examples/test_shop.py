"""Tests of the shop (examples/shop/) as a trioq user writes them, with pytest_trioq.

Run with ``pytest examples/test_shop.py``. Every test runs in virtual time
(``autojump_clock``): a 5-second timeout or a 60-second backoff costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio
import trio.testing

import trioq
from trioq.testing import FaultPlan, SimulatedCrash, assert_all_terminal, crash_points

import shop
from shop import OutOfStock, place_order, registry

pytestmark = pytest.mark.trio


@pytest.fixture(autouse=True)
def fresh_shop() -> Iterator[shop.Shop]:
    # A shop of its own for each test: SQLite in memory, and a gateway that fails only when told to.
    state = shop.Shop.local(fail_rate=0.0)
    state.db.seed({"widget": (100, 1200), "last-one": (1, 500)})
    shop.use(state)
    yield state
    shop.use(None)


async def buy(queue, fresh_shop, method="card", sku="widget"):
    return await place_order(queue, fresh_shop.db, buyer="ada", sku=sku, method=method)


async def test_charge_is_retried_after_gateway_errors(trioq_faults, trioq_open_queue, fresh_shop, autojump_clock):
    trioq_faults.fail("shop.charge", times=2, error=ConnectionError("gateway unreachable"))
    async with trioq_open_queue(registry) as queue:
        placed = await buy(queue, fresh_shop)
        done = await queue.wait(placed.charge.id)
        invoice = await queue.wait(placed.invoice.id)
    assert done.state == "succeeded"
    assert done.attempts == 3
    assert invoice.result == {"invoice": "succeeded", "amount": 1200}
    assert fresh_shop.gateway.succeeded_by_order == {placed.order.id: 1}


async def test_charge_is_idempotent(trioq_faults, trioq_open_queue, fresh_shop, autojump_clock):
    # The handler charges the card, then the worker dies before recording the
    # success: the job runs again, and the customer must not pay twice.
    trioq_faults.fail("shop.charge", times=1, when="after")
    async with trioq_open_queue(registry) as queue:
        placed = await buy(queue, fresh_shop)
        done = await queue.wait(placed.charge.id)
    assert done.state == "succeeded"
    assert fresh_shop.gateway.requests_by_order[placed.order.id] == 2  # the handler really ran twice
    assert fresh_shop.gateway.succeeded_by_order[placed.order.id] == 1  # and charged once


async def test_hung_gateway_is_detected_and_retried(trioq_faults, trioq_open_queue, fresh_shop, autojump_clock):
    trioq_faults.hang("shop.charge", times=1)
    started = trio.current_time()
    async with trioq_open_queue(registry) as queue:
        placed = await buy(queue, fresh_shop)
        done = await queue.wait(placed.charge.id)
    assert done.state == "succeeded"
    assert done.attempts == 2
    assert trio.current_time() - started >= 5.0  # the first attempt ran into its 5 s timeout
    assert [fault.kind for fault in trioq_faults.injected] == ["hang"]


@pytest.mark.parametrize(("seconds", "attempts"), [(3.0, 1), (6.0, 2)])
async def test_slow_gateway(trioq_faults, trioq_open_queue, fresh_shop, autojump_clock, seconds, attempts):
    # A slow dependency within the timeout is fine; past it, the attempt is retried.
    trioq_faults.delay("shop.charge", seconds, times=1)
    async with trioq_open_queue(registry) as queue:
        placed = await buy(queue, fresh_shop)
        done = await queue.wait(placed.charge.id)
    assert (done.state, done.attempts) == ("succeeded", attempts)


async def test_pix_payment_snoozes_until_settled(trioq_open_queue, fresh_shop, autojump_clock):
    async with trioq_open_queue(registry) as queue:
        placed = await buy(queue, fresh_shop, method="pix")
        done = await queue.wait(placed.charge.id)
    assert done.state == "succeeded"
    assert done.attempts == 1  # the snoozes while it was pending are not failed attempts
    assert fresh_shop.gateway.stats()["pending_answers"] >= 1
    assert fresh_shop.gateway.succeeded_by_order == {placed.order.id: 1}


async def test_no_email_and_no_invoice_without_a_charge(trioq_faults, trioq_open_queue, fresh_shop, autojump_clock):
    # The children wait for the charge; when it ends dead, they are cancelled, and nothing is sent.
    trioq_faults.fail("shop.charge", times=8, error=ConnectionError("gateway unreachable"))
    async with trioq_open_queue(registry) as queue:
        placed = await buy(queue, fresh_shop)
        assert (await queue.get(placed.confirm.id)).state == "waiting"
        assert (await queue.wait(placed.charge.id)).state == "dead"
        confirm = await queue.wait(placed.confirm.id)
        invoice = await queue.wait(placed.invoice.id)
    assert (confirm.state, invoice.state) == ("cancelled", "cancelled")
    assert await fresh_shop.db.rows("emails") == []
    assert await fresh_shop.db.rows("invoices") == []


async def test_a_refused_buyer_leaves_no_order_and_no_job(trioq_open_queue, fresh_shop, autojump_clock):
    async with trioq_open_queue(registry) as queue:
        await buy(queue, fresh_shop, sku="last-one")
        with pytest.raises(OutOfStock):
            await buy(queue, fresh_shop, sku="last-one")
        await queue.join()
        assert (await queue.stats())["totals"]["enqueued"] == 3  # one order's flow
    assert len(await fresh_shop.db.rows("orders")) == 1


@pytest.mark.trioq_faults(fail=0.5, task="shop.confirm", when="after")
async def test_every_order_gets_one_email(trioq_open_queue, fresh_shop, autojump_clock):
    # Half the email attempts "die" after sending: nobody gets two emails.
    async with trioq_open_queue(registry, workers=4) as queue:
        orders = [(await buy(queue, fresh_shop)).order.id for n in range(20)]
        await queue.join()
        await assert_all_terminal(queue)
    emails = [row["order_id"] for row in await fresh_shop.db.rows("emails")]
    assert sorted(emails) == sorted(orders)


# A run of the scenario below writes 27 log records (a run without a crash
# leaves the count in trioq_faults.records): crash after each one of them.
@pytest.mark.parametrize("point", crash_points(27))
async def test_orders_survive_a_crash_at_any_point(
    tmp_path, trioq_faults: FaultPlan, trioq_open_queue, fresh_shop, autojump_clock, point
):
    # The queue dies like kill -9 after its `point`-th log record. Every order
    # whose flow was acknowledged must be charged exactly once after recovery.
    trioq_faults.crash(after_records=point)
    acknowledged = []
    with pytest.raises(SimulatedCrash):
        async with trioq_open_queue(registry, store=trioq.WALStore(tmp_path, fsync="always")) as queue:
            for _ in range(3):
                placed = await buy(queue, fresh_shop)
                acknowledged.append(placed)
            await queue.join()
    # Restart on the same directory, as a supervisor would (a crash strikes once).
    async with trioq_open_queue(registry, store=trioq.WALStore(tmp_path)) as queue:
        await queue.join()
        await assert_all_terminal(queue)
        for placed in acknowledged:
            assert (await queue.get(placed.invoice.id)).state == "succeeded"
    for placed in acknowledged:
        assert fresh_shop.gateway.succeeded_by_order[placed.order.id] == 1
    emails = [row["order_id"] for row in await fresh_shop.db.rows("emails")]
    assert len(emails) == len(set(emails))  # never two emails
