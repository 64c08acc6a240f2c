"""The shop's trioq registry: the gateway's limit and the jobs of an order's flow, plus the export.

An order's flow (enqueued by ``api.place_order``)::

    shop.charge  ──┬──> shop.confirm   (the confirmation email)
                   └──> shop.invoice

``shop.charge`` holds the ``gateway`` limit key: at most 4 charges at once
and 20 starts a second with bursts of 5, across every process of the queue,
which is what the gateway allows (see ``gateway.py``). A PIX charge is
pending until it settles: the job snoozes and asks again (a snooze is not a
failed attempt). A failed charge raises, and trioq retries it with backoff;
every try carries the order's idempotency key, so however many tries there
are, the gateway charges the order once. The children start once the charge
has succeeded and read its result from ``ctx.parents``; each writes its row
at most once, so a repeated attempt sends no second email.

``shop.export`` is a long job: it writes the orders out in batches and
checkpoints its cursor in the shop's database after each one, so an attempt
cut off (``kill -9``) resumes where the last one stopped.

The handlers find the shop's database and gateway with :func:`current`: set
by :func:`use` in one process (tests, the in-process benchmark), or built
from the environment in a ``trioq worker`` process (``SHOP_DSN``: the
PostgreSQL database of the shop's tables; ``SHOP_GATEWAY``: the gateway's
URL). Run workers with ``examples/`` on the path, loading ``shop.worker``
(this registry, with the process's shop built before any attempt)::

    PYTHONPATH=examples SHOP_DSN=... SHOP_GATEWAY=http://127.0.0.1:PORT \\
        trioq worker --postgres DSN --app shop.worker:registry
"""

from __future__ import annotations

import os
import time
from typing import Any

import attrs
import trio

import trioq

from .db import Attempt, ExportState, LocalDB, PostgresDB, ShopDB
from .gateway import FakeGateway, Gateway, HTTPGateway

__all__ = ["EMAIL_SECONDS", "PIX_POLL", "Shop", "current", "registry", "use"]

#: Seconds a pending PIX charge's job snoozes before it asks the gateway again.
PIX_POLL = 0.25
#: Seconds the mail server takes per confirmation email.
EMAIL_SECONDS = 0.005

registry = trioq.Registry()
registry.limit("gateway", max=4, rate=20, per=1.0, burst=5)


@attrs.define
class Shop:
    """The services the handlers use: the shop's database and the payment gateway."""

    db: ShopDB
    gateway: Gateway

    @classmethod
    def local(cls, path: str = ":memory:", **gateway: Any) -> Shop:
        """A shop in this process: SQLite at ``path`` and a :class:`FakeGateway` (``gateway``: its options)."""
        return cls(LocalDB(path), FakeGateway(**gateway))


_current: Shop | None = None


def use(shop: Shop | None) -> None:
    """Make ``shop`` the one the handlers use in this process (``None``: back to the environment's)."""
    global _current
    _current = shop


def current() -> Shop:
    """The shop the handlers use: :func:`use`'s, else one built from ``SHOP_DSN`` and ``SHOP_GATEWAY``."""
    global _current
    if _current is None:
        dsn, url = os.environ.get("SHOP_DSN"), os.environ.get("SHOP_GATEWAY")
        if not dsn or not url:
            raise RuntimeError(
                "no shop configured in this process: call shop.use(Shop(...)) first, or set SHOP_DSN (the shop's "
                "PostgreSQL database) and SHOP_GATEWAY (the payment gateway's URL) for a trioq worker"
            )
        _current = Shop(PostgresDB(dsn), HTTPGateway(url))
    return _current


async def _journal(shop: Shop, ctx: trioq.JobContext, order_id: str | None, started: float, outcome: str) -> None:
    """Journal this attempt in the shop's database, even while the attempt is being cancelled."""
    attempt = Attempt(ctx.job.id, ctx.job.task, order_id, ctx.attempt, started, time.time(), outcome, os.getpid())
    with trio.CancelScope(shield=True), trio.move_on_after(5.0):
        await shop.db.record_attempt(attempt)


def _charge_of(ctx: trioq.JobContext) -> dict[str, Any]:
    """The result of the job's one parent, the order's charge."""
    results = list(ctx.parents.values())
    if len(results) != 1 or not isinstance(results[0], dict):
        raise trioq.NoRetry(f"expected the result of one charge job as the parent, got {ctx.parents!r}")
    return results[0]


@registry.task(
    name="shop.charge",
    limits=["gateway"],
    timeout=5.0,
    max_attempts=8,
    backoff=trioq.Backoff(base=0.2, factor=2.0, max=5.0, jitter=0.5),
)
async def charge(ctx: trioq.JobContext, order_id: str, amount: int, method: str) -> dict[str, Any]:
    """Charge the order once: pending (PIX) snoozes, a gateway error raises for a retry with backoff.

    The gateway is the first thing called: what the limiter let start reaches
    the gateway at once, not after a variable wait for the database.
    """
    started = time.time()
    shop = current()
    outcome = "error"
    try:
        result = await shop.gateway.charge(
            order_id=order_id,
            amount=amount,
            method=method,
            # One key per order, not per try: a retry after a lost answer is a replay, not a second charge.
            idempotency_key=f"order:{order_id}",
        )
        if result.status == "pending":
            outcome = "pending"
            raise trioq.Snooze(PIX_POLL)
        await shop.db.mark_paid(order_id, result.charge_id)
        outcome = "succeeded"
        return {"charge_id": result.charge_id, "amount": amount, "method": method}
    except trioq.Snooze:
        raise
    except Exception as exc:
        outcome = f"error: {type(exc).__name__}"
        raise
    finally:
        await _journal(shop, ctx, order_id, started, outcome)


@registry.task(name="shop.confirm", heartbeat_timeout=2.0, max_attempts=8, backoff=trioq.Backoff(base=0.5))
async def confirm(ctx: trioq.JobContext, order_id: str) -> dict[str, Any]:
    """Send the confirmation email once the charge succeeded (never two)."""
    started = time.time()
    shop = current()
    outcome = "error"
    try:
        paid = _charge_of(ctx)
        await trio.sleep(EMAIL_SECONDS)  # the mail server
        sent = await shop.db.send_confirmation(order_id, paid["charge_id"])
        outcome = "succeeded" if sent else "already sent"
        return {"email": outcome, "charge_id": paid["charge_id"]}
    finally:
        await _journal(shop, ctx, order_id, started, outcome)


@registry.task(name="shop.invoice", max_attempts=8, backoff=trioq.Backoff(base=0.5))
async def invoice(ctx: trioq.JobContext, order_id: str) -> dict[str, Any]:
    """Write the invoice for the amount charged (never two)."""
    started = time.time()
    shop = current()
    outcome = "error"
    try:
        paid = _charge_of(ctx)
        written = await shop.db.write_invoice(order_id, paid["charge_id"], int(paid["amount"]))
        outcome = "succeeded" if written else "already written"
        return {"invoice": outcome, "amount": paid["amount"]}
    finally:
        await _journal(shop, ctx, order_id, started, outcome)


@registry.task(name="shop.export", heartbeat_timeout=10.0, max_attempts=3)
async def export(ctx: trioq.JobContext, export_id: str, batch: int = 5, pause: float = 0.05) -> dict[str, Any]:
    """Write every order out, ``batch`` at a time (``pause`` seconds of work each), checkpointing after each.

    Resumes from the checkpoint an earlier attempt left: a cut-off attempt
    costs at most the batch it was working on.
    """
    started = time.time()
    shop = current()
    state = await shop.db.export_state(export_id)
    resumed_from = state.rows
    outcome = "error"
    try:
        while not state.done:
            orders = await shop.db.orders_after(state.cursor, batch)
            await trio.sleep(pause)  # formatting and uploading the batch
            state = ExportState(
                export_id,
                orders[-1].seq if orders else state.cursor,
                state.rows + len(orders),
                state.total + sum(o.amount for o in orders),
                done=not orders,
                pid=os.getpid(),
                updated_at=time.time(),
            )
            await shop.db.save_export(state)  # the checkpoint
            ctx.heartbeat()
        outcome = "succeeded"
        return {"rows": state.rows, "total": state.total, "resumed_from": resumed_from}
    finally:
        await _journal(shop, ctx, None, started, outcome)
