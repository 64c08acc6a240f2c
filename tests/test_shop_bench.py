"""The shop benchmark (benchmarks/shop.py) at a smaller size, asserting its invariants on every store.

The PostgreSQL run is real processes: the shop's API and two ``trioq worker``
processes on the session's cluster, the fake gateway in a process of its own,
an export SIGKILLed mid-way and resumed by the other worker.
Only invariants are asserted (never a latency): the gateway never saw more
than its limit allows in any second and never answered 429 (the PostgreSQL
run's gateway forgives more jitter: PG_GATEWAY_ALLOWANCE), every order was
charged exactly once, 25 buyers for 5 units got 5 orders and 20 refusals and
left no job behind, every job ended, and the killed export finished.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

from .pgcluster import Cluster, ExternalCluster

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

ORDERS, CLIENTS, THINK = 30, 6, 0.2  # faster than the benchmark's clients: the limiter has work to do
LEASE = 2.0
#: The jitter (s) the PostgreSQL run's gateway forgives, where the benchmark's forgives 0.05. What the
#: limiter lets start reaches the gateway from another process, and on two busy cores that trip varies:
#: with two busy loops beside it, the earliest request of a run came up to 54 ms before the strict bucket
#: allowed (``worst_rate_excess_ms``, 18 runs; 3 of 24 such runs, and one whole suite, answered a 429 at
#: 0.05). A limiter letting through twice its rate would be 25 ms further ahead with every request.
PG_GATEWAY_ALLOWANCE = 0.15


def load_bench() -> ModuleType:
    """benchmarks/shop.py as a module (it puts examples/ on sys.path for the ``shop`` package)."""
    spec = importlib.util.spec_from_file_location("shop_bench", ROOT / "benchmarks" / "shop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = load_bench()


def check_limits(gateway: dict[str, Any]) -> None:
    shown = json.dumps(gateway, sort_keys=True)  # all of it: pytest cuts a dict's repr short
    assert gateway["busiest_second"] <= 25, shown
    assert gateway["rejected_429"] == 0, shown
    assert gateway["max_in_flight"] <= 4, shown


def check_invariants(line: dict[str, Any], *, limits: bool = True) -> None:
    gateway, charges, stock = line["gateway"], line["charges"], line["stock"]
    if limits:
        check_limits(gateway)
    assert gateway["max_in_flight"] <= 4, gateway
    assert charges["orders"] == ORDERS + 5
    assert charges["charged_once"] == charges["orders"], charges  # one successful charge per order id
    assert charges["charge_attempts"] >= charges["orders"]
    assert (stock["orders"], stock["refused"], stock["stock_left"]) == (5, 20, 0), stock
    assert line["orphan_jobs"] == 0
    assert line["jobs_not_terminal"] == 0
    assert set(line["jobs"]) == {"succeeded"}, line["jobs"]
    assert line["emails_per_order_max"] == 1
    assert line["payment_start_ms"]["n"] == charges["orders"]
    assert line["continuation_ms"]["n"] == 2 * charges["orders"]


def test_shop_on_memory() -> None:
    line = trio.run(bench.run_inprocess, "memory", ORDERS, CLIENTS, THINK, 1, None)
    check_invariants(line)


def test_shop_on_wal_and_its_export_survives_kill_9(tmp_path: Path) -> None:
    line = trio.run(bench.run_inprocess, "wal", ORDERS, CLIENTS, THINK, 1, tmp_path)
    check_invariants(line)
    export = bench.wal_export_kill(tmp_path, batch=2, pause=0.03, kill_after=6)
    assert export["done"] and export["resumed_pid_differs"]
    assert export["rows"] == ORDERS + 5  # every order exported, none twice
    assert export["resumed_from"] >= export["rows_at_kill"] >= 6  # resumed from its checkpoint, not from zero


#: The PostgreSQL run's gateway figures, for test_postgres_gateway_limits_hold.
_PG_GATEWAY: dict[str, Any] = {}


def test_shop_on_postgres_processes(pg_cluster: Cluster | ExternalCluster) -> None:
    line = trio.run(
        lambda: bench.run_postgres(
            pg_cluster,
            ORDERS,
            CLIENTS,
            THINK,
            1,
            LEASE,
            lock=True,
            kill=True,
            export_pause=0.03,
            kill_after=6,
            gateway_allowance=PG_GATEWAY_ALLOWANCE,
        )
    )
    _PG_GATEWAY.update(line["gateway"])
    check_invariants(line, limits=False)
    assert line["limit_row_lock"]["row_found"] and line["limit_row_lock"]["held_s"] >= 1.0
    export = line["export"]
    assert export["done"] and export["resumed_pid_differs"], export
    assert export["rows"] == ORDERS + 5
    assert export["resumed_from"] >= export["rows_at_kill"] >= 6
    assert export["kill_to_resume_s"] >= LEASE * 0.5  # the dead node's lease had to lapse first


def test_postgres_gateway_limits_hold() -> None:
    if not _PG_GATEWAY:
        pytest.skip("the PostgreSQL shop run did not run")
    check_limits(_PG_GATEWAY)
