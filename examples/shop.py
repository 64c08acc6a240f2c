"""A tiny shop backend whose orders are charged and confirmed by trioq jobs.

``examples/test_shop.py`` tests it with the ``pytest_trioq`` plugin: failed
payments, a hung payment gateway, a slow one, a handler that runs twice, and
a crash at every point of a run.
"""

from __future__ import annotations

import attrs
import trio

import trioq

registry = trioq.Registry()


@attrs.define
class PaymentGateway:
    """Stands in for a payment provider: charges are idempotent by key, as with Stripe."""

    charges: dict[str, int] = attrs.Factory(dict)
    calls: int = 0

    async def charge(self, key: str, amount: int) -> str:
        self.calls += 1
        await trio.sleep(0.2)  # a network round trip
        self.charges.setdefault(key, amount)  # a repeated key is not charged again
        return f"ch_{key}"


@attrs.define
class Shop:
    """The app's state: stands in for its database and the services it calls."""

    gateway: PaymentGateway = attrs.Factory(PaymentGateway)
    orders: dict[str, dict[str, object]] = attrs.Factory(dict)
    receipts: list[str] = attrs.Factory(list)


#: The services the handlers use; tests swap in a fresh one (see test_shop.py).
shop = Shop()


@registry.task(timeout=5.0, max_attempts=5, backoff=trioq.Backoff(base=1.0, jitter=0.5))
async def charge_order(ctx: trioq.JobContext, order_id: str) -> str:
    order = shop.orders[order_id]
    # The order id is the idempotency key: if this attempt charged the card and
    # then died before the job was marked done, the retry charges nothing more.
    charge = await shop.gateway.charge(key=order_id, amount=int(str(order["amount"])))
    order["charge"] = charge
    return charge


@registry.task(heartbeat_timeout=2.0, max_attempts=8, backoff=trioq.Backoff(base=0.5))
async def send_receipt(ctx: trioq.JobContext, order_id: str) -> None:
    if order_id in shop.receipts:
        return  # sent by an earlier attempt whose success was never recorded
    await trio.sleep(0.1)  # the mail server
    shop.receipts.append(order_id)


async def place_order(queue: trioq.Queue, order_id: str, amount: int) -> trioq.Job:
    """Record the order, then enqueue its charge and receipt (keyed: placing twice is harmless)."""
    shop.orders.setdefault(order_id, {"amount": amount, "charge": None})
    await queue.enqueue("send_receipt", {"order_id": order_id}, key=f"receipt:{order_id}", delay=1.0)
    return await queue.enqueue("charge_order", {"order_id": order_id}, key=f"charge:{order_id}")
