"""kiln's shop, on trioq: a small shop backend whose orders are paid, confirmed and invoiced by a flow of jobs.

- ``app.py``: the registry (the ``gateway`` limit, ``shop.charge``,
  ``shop.confirm``, ``shop.invoice``, ``shop.export``) and the :class:`Shop`
  the handlers use;
- ``db.py``: the shop's own tables (SQLite in one process, PostgreSQL
  across processes);
- ``gateway.py``: the fake payment gateway, strict about its limits;
- ``api.py``: placing an order, in one transaction with its jobs on
  PostgreSQL, and the HTTP API process.

``examples/test_shop.py`` tests it with the ``pytest_trioq`` plugin (failed
payments, a hung gateway, handlers that run twice, a crash at every point);
``benchmarks/shop.py`` runs kiln's shop benchmark on it, on every store.
"""

from .api import Placed, place, place_order, place_order_tx
from .app import Shop, current, registry, use
from .db import LocalDB, OutOfStock, PostgresDB
from .gateway import FakeGateway, GatewayFailure, RateLimited

__all__ = [
    "FakeGateway",
    "GatewayFailure",
    "LocalDB",
    "OutOfStock",
    "Placed",
    "PostgresDB",
    "RateLimited",
    "Shop",
    "current",
    "place",
    "place_order",
    "place_order_tx",
    "registry",
    "use",
]
