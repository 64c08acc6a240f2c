"""Placing an order: take the stock, write the order, enqueue its flow; all of it, or none of it.

On PostgreSQL (:func:`place_order_tx`) it is one transaction on the shop's
database, which is also the queue's: the order row, the three jobs
(``queue.enqueue_tx``) and the stock. The stock is taken last, so a buyer
refused for stock has inserted an order and three jobs that the rollback
takes away again: workers never see them (``enqueue_tx`` jobs become
visible at commit).

In one process (:func:`place_order`, beside a ``MemoryStore`` or
``WALStore``) the shop's SQLite and the queue are two stores: the stock and
the order are taken in one SQLite transaction, then the flow is enqueued
with ``enqueue_many`` (all three jobs or none); if that fails, the order is
undone and its stock given back.

``python -m shop.api --postgres DSN`` (with ``examples/`` on the path) serves
``POST /orders`` and ``POST /exports`` over HTTP from a producer-only node
(``workers=0``) of the queue on ``DSN``; the jobs run on ``trioq worker``
processes.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import attrs
import trio

import trioq

from .app import Shop, registry, use
from .db import LocalDB, Order, OutOfStock, PostgresDB, UnknownItem

__all__ = ["Placed", "create_app", "main", "place_order", "place_order_tx"]


@attrs.frozen
class Placed:
    """A placed order and its flow's jobs.

    ``enqueued_at`` (wall clock): from when the jobs could be claimed: just
    before ``enqueue_many`` in one process, the commit on PostgreSQL.
    """

    order: Order
    charge: trioq.Job
    confirm: trioq.Job
    invoice: trioq.Job
    enqueued_at: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the order id, its amount, the jobs' ids and ``enqueued_at``."""
        return {
            "order_id": self.order.id,
            "amount": self.order.amount,
            "jobs": {"charge": self.charge.id, "confirm": self.confirm.id, "invoice": self.invoice.id},
            "enqueued_at": self.enqueued_at,
        }


def _charge_payload(order: Order) -> dict[str, Any]:
    # The amount and method travel with the job: the charge calls the gateway first thing, so the
    # time between the limiter's start and the gateway's arrival is the same for every charge.
    return {"order_id": order.id, "amount": order.amount, "method": order.method}


def _flow(order: Order) -> list[trioq.JobSpec]:
    payload = {"order_id": order.id}
    return [
        # The key makes placing the same order's flow twice harmless.
        trioq.JobSpec("shop.charge", _charge_payload(order), key=f"charge:{order.id}"),
        trioq.JobSpec("shop.confirm", payload, after=[0]),
        trioq.JobSpec("shop.invoice", payload, after=[0]),
    ]


async def place_order(
    queue: trioq.Queue, db: LocalDB, *, buyer: str, sku: str, qty: int = 1, method: str = "card"
) -> Placed:
    """Place an order in one process; raises :class:`~shop.db.OutOfStock` (nothing kept, nothing enqueued)."""
    order = db.place(buyer, sku, qty, method)
    enqueued_at = time.time()
    try:
        charge, confirm, invoice = await queue.enqueue_many(_flow(order))
    except BaseException:
        db.undo(order)
        raise
    return Placed(order, charge, confirm, invoice, enqueued_at)


def place_order_tx(
    queue: trioq.Queue, db: PostgresDB, conn: Any, *, buyer: str, sku: str, qty: int = 1, method: str = "card"
) -> Placed:
    """Place an order in one transaction on ``conn`` and commit it (blocking: call from a thread).

    Raises :class:`~shop.db.OutOfStock` after rolling back: the order and
    its jobs, inserted before the stock was found short, are gone.
    """
    with conn.transaction():
        order = db.insert_order_tx(conn, buyer, sku, qty, method)
        payload = {"order_id": order.id}
        charge = queue.enqueue_tx(conn, "shop.charge", _charge_payload(order), key=f"charge:{order.id}")
        confirm = queue.enqueue_tx(conn, "shop.confirm", payload, after=[charge.id])
        invoice = queue.enqueue_tx(conn, "shop.invoice", payload, after=[charge.id])
        db.take_stock_tx(conn, sku, qty)  # raises OutOfStock: the with block rolls everything back
    return Placed(order, charge, confirm, invoice, time.time())


async def place(queue: trioq.Queue, shop: Shop, **order: Any) -> Placed:
    """:func:`place_order_tx` in a worker thread on a PostgreSQL shop, else :func:`place_order`."""
    db = shop.db
    if isinstance(db, PostgresDB):
        pg = db

        def in_thread() -> Placed:
            with pg.pool.connection() as conn:
                return place_order_tx(queue, pg, conn, **order)

        return await trio.to_thread.run_sync(in_thread)
    assert isinstance(db, LocalDB)
    return await place_order(queue, db, **order)


def create_app(queue: trioq.Queue, shop: Shop) -> Any:
    """The shop's HTTP API (a QuartTrio app): ``POST /orders``, ``POST /exports``.

    ``POST /orders`` takes ``{"buyer", "sku", "qty", "method"}`` (``method``:
    ``"card"`` or ``"pix"``) and answers 201 with :meth:`Placed.to_dict`, 409
    out of stock, 404 for an unknown item, 400 for a bad body.
    ``POST /exports`` takes ``{"export_id", "batch", "pause"}`` and answers
    202 with the export job's id.
    """
    from quart import request
    from quart_trio import QuartTrio

    app = QuartTrio("shop")

    @app.post("/orders")
    async def orders() -> Any:
        body = await request.get_json(silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("buyer"), str) or not isinstance(body.get("sku"), str):
            return {"error": "expected a JSON object with string fields buyer and sku"}, 400
        qty, method = body.get("qty", 1), body.get("method", "card")
        if not isinstance(qty, int) or qty < 1 or method not in ("card", "pix"):
            return {"error": "qty must be an int >= 1 and method 'card' or 'pix'"}, 400
        try:
            placed = await place(queue, shop, buyer=body["buyer"], sku=body["sku"], qty=qty, method=method)
        except OutOfStock as exc:
            return {"error": str(exc), "field": "qty"}, 409
        except UnknownItem as exc:
            return {"error": str(exc), "field": "sku"}, 404
        return placed.to_dict(), 201

    @app.post("/exports")
    async def exports() -> Any:
        body = await request.get_json(silent=True) or {}
        payload = {"export_id": str(body.get("export_id", "all-orders"))}
        for name in ("batch", "pause"):
            if name in body:
                payload[name] = body[name]
        job = await queue.enqueue("shop.export", payload, key=f"export:{payload['export_id']}")
        return {"id": job.id}, 202

    return app


async def serve_api(args: argparse.Namespace) -> None:
    """Run the API process until SIGTERM/SIGINT (``args``: :func:`main`'s command line)."""
    import signal

    from hypercorn.config import Config
    from hypercorn.trio import serve

    db = PostgresDB(args.postgres, max_size=args.connections)
    db.create_tables()
    shop = Shop(db, gateway=None)  # type: ignore[arg-type]  # the API charges nothing itself
    use(shop)
    config = Config()
    config.bind = [f"{args.host}:{args.port}"]
    config.accesslog = None
    config.graceful_timeout = 1.0
    stop = trio.Event()
    store = trioq.PostgresStore(args.postgres, schema=args.schema, lease=args.lease)
    async with trioq.open_queue(registry, store=store, workers=0) as queue, trio.open_nursery() as nursery:

        async def on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    stop.set()
                    return

        nursery.start_soon(on_signal)
        binds = await nursery.start(
            lambda task_status: serve(
                create_app(queue, shop),
                config,  # type: ignore[arg-type]
                shutdown_trigger=stop.wait,  # type: ignore[arg-type]
                task_status=task_status,
            )
        )
        print(f"shop api serving on {binds[0]} (pid {os.getpid()})", flush=True)
        await stop.wait()
        nursery.cancel_scope.deadline = trio.current_time() + 5
    db.close()


def main(argv: list[str] | None = None) -> None:
    """``python -m shop.api --postgres DSN [--port 0] [--lease 30]``: the shop's API process."""
    parser = argparse.ArgumentParser(prog="python -m shop.api", description=main.__doc__)
    parser.add_argument("--postgres", required=True, metavar="DSN")
    parser.add_argument("--schema", default="trioq")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=12, help="the shop's pool of PostgreSQL connections")
    trio.run(serve_api, parser.parse_args(argv))


if __name__ == "__main__":
    main()
