"""The shop's own database: items and their stock, orders, confirmation emails, invoices, exports.

Two implementations of one interface (:class:`ShopDB`), over the same tables
and the same SQL:

- :class:`LocalDB`, SQLite in the shop's process (``":memory:"`` beside a
  ``MemoryStore``, a file beside a ``WALStore``: the export's checkpoints
  survive the process). Its calls are quick local ones, made on the trio
  thread; no ``await`` ever falls inside one of its transactions, so the
  shop's tasks cannot interleave inside one.
- :class:`PostgresDB`, real tables in the queue's PostgreSQL database,
  through a psycopg pool in worker threads. The API writes an order with
  :meth:`PostgresDB.insert_order_tx` and :meth:`PostgresDB.take_stock_tx` on
  the caller's connection, in the transaction that also enqueues the order's
  flow with ``queue.enqueue_tx`` (see ``api.py``).

``shop_attempts`` journals every attempt of every shop job (its start and end
on the wall clock, its outcome, the process): the benchmark's latencies and
attempt counts come from it, not from the queue.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs
import trio

__all__ = [
    "Attempt",
    "ExportState",
    "LocalDB",
    "Order",
    "OutOfStock",
    "PostgresDB",
    "ShopDB",
    "UnknownItem",
]

T = TypeVar("T")


class OutOfStock(Exception):
    """Fewer units of ``sku`` left than the order asked for: the order is refused, nothing kept."""

    def __init__(self, sku: str, qty: int) -> None:
        super().__init__(f"out of stock: fewer than {qty} of {sku!r} left")
        self.sku = sku
        self.qty = qty


class UnknownItem(Exception):
    """The shop sells no item ``sku``."""

    def __init__(self, sku: str) -> None:
        super().__init__(f"no such item: {sku!r}")
        self.sku = sku


@attrs.frozen
class Order:
    """One order row; ``seq`` orders them (the export's cursor)."""

    seq: int
    id: str
    buyer: str
    sku: str
    qty: int
    amount: int
    method: str
    status: str
    charge_id: str | None
    placed_at: float


@attrs.frozen
class Attempt:
    """One attempt of a shop job, as its handler journaled it (wall-clock seconds)."""

    job_id: str
    task: str
    order_id: str | None
    attempt: int
    started_at: float
    ended_at: float
    outcome: str
    pid: int


@attrs.frozen
class ExportState:
    """An export's checkpoint: ``cursor`` is the last order ``seq`` written; ``rows`` and ``total`` so far."""

    id: str
    cursor: int = 0
    rows: int = 0
    total: int = 0
    done: bool = False
    pid: int = 0
    updated_at: float = 0.0


_ORDER_COLUMNS = "seq, id, buyer, sku, qty, amount, method, status, charge_id, placed_at"

_TABLES = (
    "CREATE TABLE IF NOT EXISTS shop_items (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL, price INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS shop_orders ({seq}, id TEXT UNIQUE NOT NULL, buyer TEXT NOT NULL,"
    " sku TEXT NOT NULL, qty INTEGER NOT NULL, amount INTEGER NOT NULL, method TEXT NOT NULL,"
    " status TEXT NOT NULL, charge_id TEXT, placed_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS shop_emails (order_id TEXT PRIMARY KEY, charge_id TEXT NOT NULL,"
    " sent_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS shop_invoices (order_id TEXT PRIMARY KEY, charge_id TEXT NOT NULL,"
    " amount INTEGER NOT NULL, issued_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS shop_exports (id TEXT PRIMARY KEY, cursor BIGINT NOT NULL, rows BIGINT NOT NULL,"
    " total BIGINT NOT NULL, done INTEGER NOT NULL, pid INTEGER NOT NULL, updated_at DOUBLE PRECISION NOT NULL)",
    "CREATE TABLE IF NOT EXISTS shop_attempts (job_id TEXT NOT NULL, task TEXT NOT NULL, order_id TEXT,"
    " attempt INTEGER NOT NULL, started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION NOT NULL,"
    " outcome TEXT NOT NULL, pid INTEGER NOT NULL)",
)

#: The tables :meth:`ShopDB.rows` reads.
TABLES = ("items", "orders", "emails", "invoices", "exports", "attempts")


def new_order_id() -> str:
    """A fresh order id (``o-`` and 12 hex digits)."""
    return f"o-{uuid.uuid4().hex[:12]}"


class ShopDB(Protocol):
    """What the shop's handlers and the benchmark ask of its database."""

    async def order(self, order_id: str) -> Order:
        """The order ``order_id`` (``KeyError`` if there is none)."""
        ...

    async def mark_paid(self, order_id: str, charge_id: str) -> None:
        """The order is paid by ``charge_id``."""
        ...

    async def send_confirmation(self, order_id: str, charge_id: str) -> bool:
        """Record the confirmation email; ``False`` if one was sent already (never two)."""
        ...

    async def write_invoice(self, order_id: str, charge_id: str, amount: int) -> bool:
        """Write the order's invoice; ``False`` if it exists already (never two)."""
        ...

    async def record_attempt(self, attempt: Attempt) -> None:
        """Journal one job attempt."""
        ...

    async def export_state(self, export_id: str) -> ExportState:
        """The export's checkpoint, created empty the first time."""
        ...

    async def save_export(self, state: ExportState) -> None:
        """Store the export's checkpoint."""
        ...

    async def orders_after(self, seq: int, limit: int) -> list[Order]:
        """Up to ``limit`` orders with ``seq`` above ``seq``, in ``seq`` order."""
        ...

    async def rows(self, table: str) -> list[dict[str, Any]]:
        """Every row of ``shop_<table>`` (one of :data:`TABLES`) as a dict."""
        ...


class _SQL:
    """The SQL both databases run; ``%s`` placeholders (SQLite's ``?`` is put in by :class:`LocalDB`)."""

    create_seq = "seq INTEGER PRIMARY KEY AUTOINCREMENT"

    @staticmethod
    def order(row: Sequence[Any]) -> Order:
        seq, order_id, buyer, sku, qty, amount, method, status, charge_id, placed_at = row
        return Order(int(seq), order_id, buyer, sku, int(qty), int(amount), method, status, charge_id, float(placed_at))


class _Base:
    """The queries, over :meth:`_run` (a sync function given a cursor-like ``execute``) in the right thread."""

    seq_column = "seq INTEGER PRIMARY KEY AUTOINCREMENT"

    async def _run(self, fn: Callable[[Any], T]) -> T:
        raise NotImplementedError

    def _x(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return cur.execute(sql, params)

    # --------------------------------------------------------------- setup

    def _create(self, cur: Any) -> None:
        for statement in _TABLES:
            self._x(cur, statement.format(seq=self.seq_column))

    def _seed(self, cur: Any, items: dict[str, tuple[int, int]]) -> None:
        for sku, (stock, price) in items.items():
            self._x(
                cur,
                "INSERT INTO shop_items (sku, stock, price) VALUES (%s, %s, %s)"
                " ON CONFLICT (sku) DO UPDATE SET stock = excluded.stock, price = excluded.price",
                (sku, stock, price),
            )

    # --------------------------------------------------------------- orders

    def _insert_order(self, cur: Any, buyer: str, sku: str, qty: int, method: str) -> Order:
        row = self._x(cur, "SELECT price FROM shop_items WHERE sku = %s", (sku,)).fetchone()
        if row is None:
            raise UnknownItem(sku)
        order_id, placed_at = new_order_id(), time.time()
        found = self._x(
            cur,
            "INSERT INTO shop_orders (id, buyer, sku, qty, amount, method, status, charge_id, placed_at)"
            f" VALUES (%s, %s, %s, %s, %s, %s, 'placed', NULL, %s) RETURNING {_ORDER_COLUMNS}",
            (order_id, buyer, sku, qty, int(row[0]) * qty, method, placed_at),
        ).fetchone()
        return _SQL.order(found)

    def _take_stock(self, cur: Any, sku: str, qty: int) -> int:
        row = self._x(cur, "UPDATE shop_items SET stock = stock - %s WHERE sku = %s RETURNING stock", (qty, sku))
        left = row.fetchone()
        if left is None:
            raise UnknownItem(sku)
        if int(left[0]) < 0:
            raise OutOfStock(sku, qty)
        return int(left[0])

    def _order(self, cur: Any, order_id: str) -> Order:
        row = self._x(cur, f"SELECT {_ORDER_COLUMNS} FROM shop_orders WHERE id = %s", (order_id,)).fetchone()
        if row is None:
            raise KeyError(f"no order {order_id!r}")
        return _SQL.order(row)

    async def order(self, order_id: str) -> Order:
        return await self._run(lambda cur: self._order(cur, order_id))

    async def mark_paid(self, order_id: str, charge_id: str) -> None:
        await self._run(
            lambda cur: self._x(
                cur, "UPDATE shop_orders SET status = 'paid', charge_id = %s WHERE id = %s", (charge_id, order_id)
            )
        )

    def _insert_once(self, cur: Any, sql: str, params: Sequence[Any]) -> bool:
        return bool(self._x(cur, sql + " ON CONFLICT DO NOTHING RETURNING order_id", params).fetchone())

    async def send_confirmation(self, order_id: str, charge_id: str) -> bool:
        sql = "INSERT INTO shop_emails (order_id, charge_id, sent_at) VALUES (%s, %s, %s)"
        return await self._run(lambda cur: self._insert_once(cur, sql, (order_id, charge_id, time.time())))

    async def write_invoice(self, order_id: str, charge_id: str, amount: int) -> bool:
        sql = "INSERT INTO shop_invoices (order_id, charge_id, amount, issued_at) VALUES (%s, %s, %s, %s)"
        return await self._run(lambda cur: self._insert_once(cur, sql, (order_id, charge_id, amount, time.time())))

    async def record_attempt(self, attempt: Attempt) -> None:
        await self._run(
            lambda cur: self._x(
                cur,
                "INSERT INTO shop_attempts (job_id, task, order_id, attempt, started_at, ended_at, outcome, pid)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                attrs.astuple(attempt),
            )
        )

    # -------------------------------------------------------------- exports

    def _export_state(self, cur: Any, export_id: str) -> ExportState:
        self._x(
            cur,
            "INSERT INTO shop_exports (id, cursor, rows, total, done, pid, updated_at) VALUES (%s, 0, 0, 0, 0, 0, 0)"
            " ON CONFLICT (id) DO NOTHING",
            (export_id,),
        )
        row = self._x(
            cur, "SELECT id, cursor, rows, total, done, pid, updated_at FROM shop_exports WHERE id = %s", (export_id,)
        ).fetchone()
        return ExportState(row[0], int(row[1]), int(row[2]), int(row[3]), bool(row[4]), int(row[5]), float(row[6]))

    async def export_state(self, export_id: str) -> ExportState:
        return await self._run(lambda cur: self._export_state(cur, export_id))

    async def save_export(self, state: ExportState) -> None:
        await self._run(
            lambda cur: self._x(
                cur,
                "UPDATE shop_exports SET cursor = %s, rows = %s, total = %s, done = %s, pid = %s, updated_at = %s"
                " WHERE id = %s",
                (state.cursor, state.rows, state.total, int(state.done), state.pid, state.updated_at, state.id),
            )
        )

    async def orders_after(self, seq: int, limit: int) -> list[Order]:
        sql = f"SELECT {_ORDER_COLUMNS} FROM shop_orders WHERE seq > %s ORDER BY seq LIMIT %s"
        return await self._run(lambda cur: [_SQL.order(r) for r in self._x(cur, sql, (seq, limit)).fetchall()])

    async def rows(self, table: str) -> list[dict[str, Any]]:
        if table not in TABLES:
            raise ValueError(f"no shop table {table!r}; the tables are {', '.join(TABLES)}")

        def read(cur: Any) -> list[dict[str, Any]]:
            found = self._x(cur, f"SELECT * FROM shop_{table}")
            names = [d[0] for d in found.description]
            return [dict(zip(names, row, strict=True)) for row in found.fetchall()]

        return await self._run(read)


class LocalDB(_Base):
    """The shop's tables in SQLite, in this process (``path``: a file, or ``":memory:"``).

    Every method is one transaction on the trio thread, without a checkpoint
    inside, so concurrent trio tasks see each one as atomic.
    """

    def __init__(self, path: str | os.PathLike[str] = ":memory:") -> None:
        self.path = str(path)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if self.path != ":memory:":
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")  # a killed process loses nothing committed
        with self._tx() as cur:
            self._create(cur)

    def _tx(self) -> Any:
        db = self

        class _Tx:
            def __enter__(self) -> sqlite3.Cursor:
                self.cur = db._conn.cursor()
                self.cur.execute("BEGIN IMMEDIATE")
                return self.cur

            def __exit__(self, kind: object, *rest: object) -> None:
                self.cur.execute("ROLLBACK" if kind is not None else "COMMIT")
                self.cur.close()

        return _Tx()

    def _x(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return cur.execute(sql.replace("%s", "?"), tuple(params))

    async def _run(self, fn: Callable[[Any], T]) -> T:
        with self._tx() as cur:
            return fn(cur)

    def seed(self, items: dict[str, tuple[int, int]]) -> None:
        """Set each item's ``(stock, price)``."""
        with self._tx() as cur:
            self._seed(cur, items)

    def place(self, buyer: str, sku: str, qty: int, method: str) -> Order:
        """Take the stock and write the order, in one transaction; raises :class:`OutOfStock`, :class:`UnknownItem`."""
        with self._tx() as cur:
            self._take_stock(cur, sku, qty)
            return self._insert_order(cur, buyer, sku, qty, method)

    def undo(self, order: Order) -> None:
        """Give the order's stock back and delete it (its flow could not be enqueued)."""
        with self._tx() as cur:
            self._x(cur, "DELETE FROM shop_orders WHERE id = %s", (order.id,))
            self._x(cur, "UPDATE shop_items SET stock = stock + %s WHERE sku = %s", (order.qty, order.sku))

    def close(self) -> None:
        """Close the SQLite connection."""
        self._conn.close()


class PostgresDB(_Base):
    """The shop's tables in PostgreSQL (``dsn``), through a small psycopg pool used from worker threads."""

    seq_column = "seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"

    def __init__(self, dsn: str, *, max_size: int = 8) -> None:
        from psycopg_pool import ConnectionPool

        self.dsn = dsn
        self.pool = ConnectionPool(dsn, min_size=1, max_size=max_size, open=True, kwargs={"autocommit": False})

    def run_sync(self, fn: Callable[[Any], T]) -> T:
        """``fn(conn)`` in one transaction on a pooled connection (blocking: call from a thread)."""
        with self.pool.connection() as conn, conn.transaction():
            return fn(conn)

    async def _run(self, fn: Callable[[Any], T]) -> T:
        return await trio.to_thread.run_sync(self.run_sync, lambda conn: fn(conn.cursor()))

    def create_tables(self) -> None:
        """Create the shop's tables if they are missing (blocking)."""
        self.run_sync(lambda conn: self._create(conn.cursor()))

    def seed(self, items: dict[str, tuple[int, int]]) -> None:
        """Set each item's ``(stock, price)`` (blocking)."""
        self.run_sync(lambda conn: self._seed(conn.cursor(), items))

    def insert_order_tx(self, conn: Any, buyer: str, sku: str, qty: int, method: str) -> Order:
        """Write the order with the caller's ``conn``, inside the caller's transaction."""
        return self._insert_order(conn.cursor(), buyer, sku, qty, method)

    def take_stock_tx(self, conn: Any, sku: str, qty: int) -> int:
        """Take ``qty`` of ``sku`` inside the caller's transaction (the row stays locked until it ends);
        raises :class:`OutOfStock`, after which the caller must roll back."""
        return self._take_stock(conn.cursor(), sku, qty)

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()
