"""kiln's shop benchmark, reproduced on trioq's stores (``examples/shop/``).

Run from the repository root::

    python benchmarks/shop.py --store memory
    python benchmarks/shop.py --store wal
    python benchmarks/shop.py --store postgres [--dsn postgresql://...]
    python benchmarks/shop.py --table benchmarks/results/shop.jsonl     # the docs' table

Options: ``--orders 150 --clients 15`` (kiln's run), ``--think S`` (mean
seconds a client waits between its orders, exponential), ``--lease S``
(PostgreSQL nodes' lease, 5 s), ``--seed N``, ``--no-save``.

One run, per store:

1. **Stock**: 25 buyers at once for the 5 units of ``limited``: the shop must
   take exactly 5 orders and refuse 20, and leave no job of a refused order.
2. **Orders**: ``--clients`` clients place ``--orders`` orders of
   ``widget`` between them (20% PIX), each waiting ``--think`` seconds on
   average between orders. Every order's flow is ``shop.charge`` (under the
   ``gateway`` limit: max 4, 20/s, burst 5) then ``shop.confirm`` and
   ``shop.invoice``. On PostgreSQL, halfway through, another connection
   locks the gateway key's row of ``trioq.limit_rates`` (``SELECT ... FOR
   UPDATE``) for 1 s. The run waits until every job is terminal.
3. **Export under kill -9** (WAL and PostgreSQL): an export job
   checkpointing per batch is started; once it has written some rows, the
   process running it is SIGKILLed. On PostgreSQL the other ``trioq
   worker`` resumes it once the dead node's lease lapses; on WAL the process
   is started again on the same directory. The figure: seconds from the kill
   (and from the restart) until the export's checkpoint moves again.

Processes: memory and WAL run in this process (the gateway is called
directly); PostgreSQL runs the shop's API (``python -m shop.api``) and two
``trioq worker --app shop.worker:registry`` processes on a throwaway cluster
(``tests/pgcluster.py``, unless ``--dsn``), and the fake gateway as a process
of its own (``python -m shop.gateway``, on 127.0.0.1), so that one instance
counts every request and the times it stamps on them are not held up by this
process's clients.

Figures: the busiest second at the gateway (most requests in any 1 s
window) and its 429s; payment-job enqueue → first start (p50, p90);
continuation, the charge job's ``finished_at`` → a child's first start (p50,
p90); successful charges per order at the gateway (exactly 1 each) and the
tries; stock orders and refusals; jobs left behind; the export's resume time.
Latencies come from the handlers' own journal (``shop_attempts``, wall
clock). One JSON line (``section: "shop"``) per run on stdout, appended to
``benchmarks/results/shop.jsonl`` unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent
for _path in (_ROOT / "examples", _ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import trio  # noqa: E402

import trioq  # noqa: E402
from benchmarks._common import env_line, logger, percentile, pg_server, r3  # noqa: E402

from shop import FakeGateway, LocalDB, OutOfStock, PostgresDB, Shop, registry, use  # noqa: E402
from shop.api import place_order  # noqa: E402
from shop.gateway import busiest_window  # noqa: E402

log = logger("shop")

RESULTS = _ROOT / "benchmarks" / "results" / "shop.jsonl"
EXAMPLES = _ROOT / "examples"
#: The item most orders buy: stock for any run, a price in cents.
WIDGET = ("widget", 1_000_000, 1_990)
#: The scarce item: 25 buyers for 5 units.
LIMITED, UNITS, BUYERS = "limited", 5, 25
#: Share of orders paid by PIX (pending until the gateway settles them).
PIX_SHARE = 0.2
#: The export under kill -9: rows per batch, seconds per batch, and the rows written before the kill.
EXPORT_BATCH, EXPORT_PAUSE, KILL_AFTER_ROWS = 2, 0.08, 20
#: Bound on any wait of the run (seconds).
TIMEOUT = 120.0
#: kiln's published figures, for the table.
KILN = {
    "busiest_second": "v0.4.0: 24-25, no 429; v0.3.1: 40 with 429s",
    "payment_start_p50_ms": "5-6 ms (PostgreSQL)",
    "continuation_p50_ms": "5-6 ms (PostgreSQL)",
    "resume_s": "14 s (MySQL), 24 s (SQLite)",
}
TERMINAL = {"succeeded", "dead", "cancelled"}


# ------------------------------------------------------------------ load


async def stock_phase(place: Callable[..., Awaitable[dict[str, Any] | None]]) -> dict[str, Any]:
    """25 buyers at once for 5 units; ``place`` returns a placed order's dict, or ``None`` when refused."""
    placed: list[dict[str, Any]] = []
    refused = 0

    async def buyer(n: int) -> None:
        nonlocal refused
        got = await place(buyer=f"rush-{n}", sku=LIMITED, qty=1, method="card")
        if got is None:
            refused += 1
        else:
            placed.append(got)

    async with trio.open_nursery() as nursery:
        for n in range(BUYERS):
            nursery.start_soon(buyer, n)
    return {"buyers": BUYERS, "units": UNITS, "orders": len(placed), "refused": refused, "placed": placed}


async def order_phase(
    place: Callable[..., Awaitable[dict[str, Any] | None]],
    orders: int,
    clients: int,
    think: float,
    seed: int,
    halfway: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """``clients`` clients place ``orders`` orders between them, pausing ``think`` s on average (exponential)."""
    placed: list[dict[str, Any]] = []
    shares = [orders // clients + (1 if i < orders % clients else 0) for i in range(clients)]

    async def client(n: int, count: int) -> None:
        rng = random.Random(f"{seed}:client:{n}")
        await trio.sleep(rng.uniform(0, think))
        for k in range(count):
            method = "pix" if rng.random() < PIX_SHARE else "card"
            got = await place(buyer=f"client-{n}", sku=WIDGET[0], qty=1, method=method)
            if got is None:
                raise RuntimeError("a widget order was refused: the widget never runs out")
            placed.append(got)
            if halfway is not None and len(placed) == orders // 2:
                halfway()
            if k + 1 < count:
                await trio.sleep(rng.expovariate(1.0 / think))

    async with trio.open_nursery() as nursery:
        for n, count in enumerate(shares):
            nursery.start_soon(client, n, count)
    return placed


# --------------------------------------------------------------- figures


def over_gcra(times: list[float], rate: float = 20.0, burst: int = 5, slack: float = 0.005) -> int:
    """How many of ``times`` a GCRA of ``rate``/s with room for ``burst`` (and ``slack`` s) would refuse."""
    interval, tat, over = 1.0 / rate, float("-inf"), 0
    for t in sorted(times):
        tat = max(tat, t)
        if tat - t > (burst - 1) * interval + slack:
            over += 1
            continue
        tat += interval
    return over


def _ms(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "max": None, "n": 0}
    return {
        "p50": r3(percentile(values, 50) * 1000),
        "p90": r3(percentile(values, 90) * 1000),
        "max": r3(max(values) * 1000),
        "n": len(values),
    }


def figures(
    placed: list[dict[str, Any]],
    attempts: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    order_ids: set[str],
    gateway: dict[str, Any],
) -> dict[str, Any]:
    """The run's figures from the orders placed, the handlers' journal, the queue's jobs and the gateway."""
    first_start: dict[str, float] = {}
    charge_attempts: Counter[str] = Counter()
    for a in attempts:
        job = a["job_id"]
        first_start[job] = min(first_start.get(job, a["started_at"]), a["started_at"])
        if a["task"] == "shop.charge":
            charge_attempts[job] += 1
    finished = {j["id"]: j["finished_at"] for j in jobs}
    payment = [
        first_start[p["jobs"]["charge"]] - p["enqueued_at"] for p in placed if p["jobs"]["charge"] in first_start
    ]
    continuation = [
        first_start[p["jobs"][child]] - finished[p["jobs"]["charge"]]
        for p in placed
        for child in ("confirm", "invoice")
        if p["jobs"][child] in first_start and finished.get(p["jobs"]["charge"]) is not None
    ]
    succeeded = gateway["succeeded_by_order"]
    states = Counter(j["state"] for j in jobs)
    shop_jobs = [j for j in jobs if j["task"] in ("shop.charge", "shop.confirm", "shop.invoice")]
    orphans = [j["id"] for j in shop_jobs if j["order_id"] not in order_ids]
    return {
        "gateway": {
            "requests": gateway["requests"],
            "busiest_second": gateway["busiest_second"],
            "rejected_429": gateway["rejected_429"],
            "rejected_429_rate": gateway["rejected_429_rate"],
            "rejected_429_concurrency": gateway["rejected_429_concurrency"],
            "max_in_flight": gateway["max_in_flight"],
            "failed_503": gateway["failed_503"],
            "pending_answers": gateway["pending_answers"],
            "replays": gateway["replays"],
            "strict_rate_violations": gateway["strict_rate_violations"],
            "worst_rate_excess_ms": gateway["worst_rate_excess_ms"],
            # The limiter's own view: charge attempts started (handlers' journal) in any 1 s window.
            "starts_over_gcra": over_gcra([a["started_at"] for a in attempts if a["task"] == "shop.charge"]),
            "busiest_second_of_starts": busiest_window(
                [a["started_at"] for a in attempts if a["task"] == "shop.charge"]
            ),
        },
        "charges": {
            "orders": len(order_ids),
            "charged_once": sum(1 for o in order_ids if succeeded.get(o) == 1),
            "charged_twice_or_more": sum(1 for o in order_ids if succeeded.get(o, 0) > 1),
            "never_charged": sum(1 for o in order_ids if o not in succeeded),
            "gateway_requests_max_per_order": max(gateway["requests_by_order"].values(), default=0),
            "charge_attempts": sum(charge_attempts.values()),
        },
        "payment_start_ms": _ms(payment),
        "continuation_ms": _ms(continuation),
        "jobs": dict(sorted(states.items())),
        "jobs_not_terminal": sum(n for s, n in states.items() if s not in TERMINAL),
        "orphan_jobs": len(orphans),
        "emails_per_order_max": None,
    }


def _order_of(payload: Any) -> str | None:
    if isinstance(payload, str):
        payload = json.loads(payload)
    value = payload.get("order_id") if isinstance(payload, dict) else None
    return str(value) if value is not None else None


def _gateway_stats(stats: dict[str, Any], since: float | None = None) -> dict[str, Any]:
    """The gateway's :meth:`FakeGateway.stats` without its request times (``since``: busiest second from then)."""
    stats = dict(stats)
    times = stats.pop("request_times")
    if since is not None:
        stats["busiest_second"] = busiest_window([t for t in times if t >= since])
    return stats


# ------------------------------------------------------------ in process


async def run_inprocess(
    store_kind: str, orders: int, clients: int, think: float, seed: int, directory: Path | None = None
) -> dict[str, Any]:
    """Stock and orders phases with a MemoryStore or a WALStore (``directory``) in this process."""
    if store_kind == "wal":
        assert directory is not None
        store: trioq.Store = trioq.WALStore(directory / "queue", fsync="always")
        db = LocalDB(directory / "shop.sqlite")
    else:
        store, db = trioq.MemoryStore(), LocalDB(":memory:")
    db.seed({WIDGET[0]: WIDGET[1:], LIMITED: (UNITS, 4_990)})
    gateway = FakeGateway(seed=seed)
    shop = Shop(db, gateway)
    use(shop)
    try:
        async with trioq.open_queue(registry, store=store, workers=16) as queue:

            async def place(**order: Any) -> dict[str, Any] | None:
                try:
                    return (await place_order(queue, db, **order)).to_dict()
                except OutOfStock:
                    return None

            started = time.monotonic()
            stock = await stock_phase(place)
            await _settle(queue)
            placed = await order_phase(place, orders, clients, think, seed)
            with trio.fail_after(TIMEOUT):
                await queue.join()
            elapsed = time.monotonic() - started
            all_placed = [*stock.pop("placed"), *placed]
            jobs = []
            for p in all_placed:
                for job_id in p["jobs"].values():
                    job = await queue.get(job_id)
                    jobs.append(
                        {
                            "id": job.id,
                            "task": job.task,
                            "state": job.state.value,
                            "finished_at": job.finished_at,
                            "order_id": job.payload.get("order_id"),
                        }
                    )
        attempts = await db.rows("attempts")
        order_ids = {o["id"] for o in await db.rows("orders")}
        stock["stock_left"] = next(int(i["stock"]) for i in await db.rows("items") if i["sku"] == LIMITED)
        emails = Counter(e["order_id"] for e in await db.rows("emails"))
        line = figures(all_placed, attempts, jobs, order_ids, _gateway_stats(gateway.stats()))
        line["emails_per_order_max"] = max(emails.values(), default=0)
        line["stock"] = stock
        line["seconds"] = r3(elapsed)
        return line
    finally:
        use(None)
        db.close()


async def _settle(queue: trioq.Queue) -> None:
    with trio.fail_after(TIMEOUT):
        await queue.join()


# ------------------------------------------------------ WAL kill -9 export


def _export_progress_sqlite(path: Path, export_id: str) -> tuple[int, int, float, bool] | None:
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return None
    try:
        row = conn.execute("SELECT rows, pid, updated_at, done FROM shop_exports WHERE id = ?", (export_id,)).fetchone()
    except sqlite3.Error:
        row = None
    finally:
        conn.close()
    return None if row is None else (int(row[0]), int(row[1]), float(row[2]), bool(row[3]))


def _poll(check: Callable[[], Any], timeout: float, what: str, every: float = 0.005) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(every)


def wal_export_kill(directory: Path, *, batch: int, pause: float, kill_after: int) -> dict[str, Any]:
    """An export in a child process on ``directory``, SIGKILLed after ``kill_after`` rows, then restarted."""
    export_id = "kill-9"
    sqlite_path = directory / "shop.sqlite"
    command = [sys.executable, str(Path(__file__)), "--child", "wal-export", str(directory), str(batch), str(pause)]
    first = subprocess.Popen([*command, "--enqueue"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second: subprocess.Popen[bytes] | None = None
    try:
        progress = _poll(
            lambda: (p := _export_progress_sqlite(sqlite_path, export_id)) and p[0] >= kill_after and p,
            30,
            "the export writing rows",
        )
        os.kill(first.pid, signal.SIGKILL)
        killed_at = time.time()
        first.wait(timeout=10)
        at_kill = _export_progress_sqlite(sqlite_path, export_id)
        assert at_kill is not None and at_kill[1] == first.pid, (at_kill, first.pid)
        restarted_at = time.time()
        second = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        moved = _poll(
            lambda: (p := _export_progress_sqlite(sqlite_path, export_id)) and p[2] > killed_at and p,
            30,
            "the export resuming after the restart",
        )
        out, _ = second.communicate(timeout=TIMEOUT)
        result = json.loads(out.decode().strip().splitlines()[-1])
        return {
            "rows_at_kill": at_kill[0],
            "rows_when_seen": progress[0],
            "resumed_pid_differs": moved[1] != first.pid,
            "kill_to_resume_s": r3(moved[2] - killed_at),
            "restart_to_resume_s": r3(moved[2] - restarted_at),
            "rows": result["rows"],
            "resumed_from": result["resumed_from"],
            "done": result["state"] == "succeeded",
        }
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


async def _wal_export_child(directory: Path, batch: int, pause: float, enqueue: bool) -> None:
    db = LocalDB(directory / "shop.sqlite")
    use(Shop(db, FakeGateway()))
    async with trioq.open_queue(registry, store=trioq.WALStore(directory / "queue", fsync="always"), workers=4) as q:
        payload = {"export_id": "kill-9", "batch": batch, "pause": pause}
        # The key finds the job again after a restart (the recovered one, never a second export).
        job = await q.enqueue("shop.export", payload, key="export:kill-9")
        done = await q.wait(job.id, timeout=TIMEOUT)
    result = done.result if isinstance(done.result, dict) else {}
    print(json.dumps({"state": done.state.value, **result}), flush=True)


# ------------------------------------------------------------ PostgreSQL


_API_BANNER = re.compile(r"shop api serving on (http://\S+)")
_GATEWAY_BANNER = re.compile(r"fake gateway serving on (http://\S+)")
_WORKER_BANNER = re.compile(r"trioq worker (\S+):")


class Child:
    """A child process of the PostgreSQL run (the API or a worker); stderr to a file; killed at the end."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], logs: Path, banner: re.Pattern[str]) -> None:
        from tests.processes import read_until

        self.name = name
        self.stderr_path = logs / f"{name}.stderr"
        self._stderr = self.stderr_path.open("wb")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._stderr, env=env, cwd=_ROOT)
        match, buffer = read_until(self.process, banner, 30)
        if match is None:
            self.stop()
            raise RuntimeError(
                f"{name} did not start: {buffer!r} {self.stderr_path.read_text(errors='replace')[-2000:]}"
            )
        self.banner = match.group(1)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()


def _lock_limit_row(dsn: str, hold: float, out: dict[str, Any]) -> None:
    """Lock the gateway key's ``trioq.limit_rates`` row for ``hold`` seconds from a connection of its own."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        t0 = time.time()
        rows = conn.execute("SELECT key, tat FROM trioq.limit_rates WHERE key = 'gateway' FOR UPDATE").fetchall()
        out["locked_at"] = time.time()
        out["row_found"] = len(rows) == 1
        out["wait_to_lock_s"] = r3(out["locked_at"] - t0)
        time.sleep(hold)
        conn.commit()
        out["held_s"] = r3(time.time() - out["locked_at"])


def _pg_rows(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, params).fetchall()


async def run_postgres(
    cluster: Any, orders: int, clients: int, think: float, seed: int, lease: float, *, lock: bool = True,
    kill: bool = True, export_batch: int = EXPORT_BATCH, export_pause: float = EXPORT_PAUSE,
    kill_after: int = KILL_AFTER_ROWS, gateway_allowance: float = 0.05,
) -> dict[str, Any]:  # fmt: skip
    """The three phases against an API process and two ``trioq worker`` processes on a fresh database.

    ``gateway_allowance``: the seconds of jitter the gateway's rate bucket forgives (its ``--allowance``).
    """
    import httpx

    dsn = cluster.create_database(f"shop_{os.getpid()}_{time.monotonic_ns() % 10**8}")
    db = PostgresDB(dsn, max_size=4)
    db.create_tables()
    db.seed({WIDGET[0]: WIDGET[1:], LIMITED: (UNITS, 4_990)})
    logs = Path(tempfile.mkdtemp(prefix="trioq-shop-"))
    children: list[Child] = []
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(EXAMPLES), str(_ROOT)]), PYTHONUNBUFFERED="1")
        gateway_command = [sys.executable, "-m", "shop.gateway", "--port", "0", "--seed", str(seed)]
        gateway_command += ["--allowance", str(gateway_allowance)]
        gateway = await trio.to_thread.run_sync(Child, "gateway", gateway_command, env, logs, _GATEWAY_BANNER)
        children.append(gateway)
        url = gateway.banner
        env.update(SHOP_DSN=dsn, SHOP_GATEWAY=url)
        api_command = [sys.executable, "-m", "shop.api", "--postgres", dsn, "--port", "0", "--lease", str(lease)]
        api = await trio.to_thread.run_sync(Child, "api", api_command, env, logs, _API_BANNER)
        children.append(api)
        worker_command = [
            sys.executable,
            "-m",
            "trioq",
            "worker",
            "--postgres",
            dsn,
            "--app",
            "shop.worker:registry",
        ]
        worker_command += ["--lease", str(lease), "--workers", "8", "--shutdown-grace", "2"]
        workers = []
        for n in range(2):
            child = await trio.to_thread.run_sync(Child, f"worker{n}", worker_command, env, logs, _WORKER_BANNER)
            children.append(child)
            workers.append(child)
        log(f"api {api.banner} (pid {api.pid}), workers {[w.pid for w in workers]}, gateway {url}")
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=api.banner, timeout=30, limits=limits) as client:

            async def place(**order: Any) -> dict[str, Any] | None:
                response = await client.post("/orders", json=order)
                if response.status_code == 409:
                    return None
                if response.status_code != 201:
                    raise RuntimeError(f"POST /orders: {response.status_code} {response.text}")
                placed: dict[str, Any] = response.json()
                return placed

            started = time.monotonic()
            stock = await stock_phase(place)
            lock_info: dict[str, Any] = {}
            locker: list[threading.Thread] = []

            def halfway() -> None:
                if lock:
                    thread = threading.Thread(target=_lock_limit_row, args=(dsn, 1.0, lock_info), daemon=True)
                    thread.start()
                    locker.append(thread)

            placed = await order_phase(place, orders, clients, think, seed, halfway)
            all_placed = [*stock.pop("placed"), *placed]
            ids = [job for p in all_placed for job in p["jobs"].values()]

            def unfinished() -> int:
                sql = "SELECT count(*) FROM trioq.jobs WHERE id = ANY(%s) AND state <> ALL(%s)"
                return int(_pg_rows(dsn, sql, (ids, list(TERMINAL)))[0][0])

            with trio.fail_after(TIMEOUT):
                while await trio.to_thread.run_sync(unfinished):  # noqa: ASYNC110 (another process's state)
                    await trio.sleep(0.05)
            elapsed = time.monotonic() - started
            for thread in locker:
                await trio.to_thread.run_sync(thread.join, 10)
            gateway_stats = _gateway_stats((await client.get(f"{url}/stats")).json())
            export = None
            if kill:
                export = await _pg_export_kill(client, dsn, workers, lease, export_batch, export_pause, kill_after)
        # Workers and the API first, the gateway last (it is the first child).
        for child in reversed(children):
            await trio.to_thread.run_sync(child.stop)
        rows = await trio.to_thread.run_sync(
            _pg_rows, dsn, "SELECT id, task, state, finished_at, payload::text FROM trioq.jobs"
        )
        jobs = [
            {"id": r[0], "task": r[1], "state": r[2], "finished_at": r[3], "order_id": _order_of(r[4])} for r in rows
        ]
        attempts = await db.rows("attempts")
        order_ids = {o["id"] for o in await db.rows("orders")}
        stock["stock_left"] = next(int(i["stock"]) for i in await db.rows("items") if i["sku"] == LIMITED)
        emails = Counter(e["order_id"] for e in await db.rows("emails"))
        line = figures(all_placed, attempts, [j for j in jobs if j["id"] in set(ids)], order_ids, gateway_stats)
        # Jobs left behind: any shop job of the database whose order does not exist (a rolled-back one).
        line["orphan_jobs"] = sum(
            1
            for j in jobs
            if j["task"] != "shop.export" and j["task"].startswith("shop.") and j["order_id"] not in order_ids
        )
        line["emails_per_order_max"] = max(emails.values(), default=0)
        line["stock"] = stock
        line["seconds"] = r3(elapsed)
        if lock:
            line["limit_row_lock"] = lock_info
        if export is not None:
            line["export"] = export
        line["lease_s"] = lease
        return line
    finally:
        for child in reversed(children):
            child.stop(grace=1.0)
        db.close()


async def _pg_export_kill(
    client: Any, dsn: str, workers: list[Child], lease: float, batch: int, pause: float, kill_after: int
) -> dict[str, Any]:
    export_id = "kill-9"
    response = await client.post("/exports", json={"export_id": export_id, "batch": batch, "pause": pause})
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]

    def progress() -> tuple[int, int, float, bool] | None:
        rows = _pg_rows(dsn, "SELECT rows, pid, updated_at, done FROM shop_exports WHERE id = %s", (export_id,))
        return None if not rows else (int(rows[0][0]), int(rows[0][1]), float(rows[0][2]), bool(rows[0][3]))

    async def polled(fetch: Callable[[], Any], check: Callable[[Any], bool]) -> Any:
        """``fetch()`` (in a thread) every 10 ms until it finds something ``check`` takes."""
        with trio.fail_after(TIMEOUT):
            while True:
                found = await trio.to_thread.run_sync(fetch)
                if found and check(found):
                    return found
                await trio.sleep(0.01)

    async def until(check: Callable[[tuple[int, int, float, bool]], bool]) -> tuple[int, int, float, bool]:
        found: tuple[int, int, float, bool] = await polled(progress, check)
        return found

    seen = await until(lambda p: p[0] >= kill_after)  # the export writing rows
    victim = next((w for w in workers if w.pid == seen[1]), None)
    if victim is None:
        raise RuntimeError(f"the export runs in pid {seen[1]}, none of this run's workers {[w.pid for w in workers]}")
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.time()
    await trio.to_thread.run_sync(victim.process.wait, 10)
    at_kill = await trio.to_thread.run_sync(progress)
    assert at_kill is not None
    moved = await until(lambda p: p[2] > killed_at)  # the export resuming on the other worker
    done = await until(lambda p: p[3])  # the export finishing
    # The handler marks the export done, then returns: its job ends when the node's completer commits,
    # a moment later (tens of milliseconds on two busy cores).
    state = await polled(
        lambda: _pg_rows(dsn, "SELECT state, result::text FROM trioq.jobs WHERE id = %s", (job_id,)),
        lambda rows: rows[0][0] != "running",
    )
    result = json.loads(state[0][1]) if state and state[0][1] else {}
    return {
        "lease_s": lease,
        "rows_at_kill": at_kill[0],
        "resumed_pid_differs": moved[1] != victim.pid,
        "kill_to_resume_s": r3(moved[2] - killed_at),
        "rows": done[0],
        "resumed_from": result.get("resumed_from"),
        "done": bool(state) and state[0][0] == "succeeded",
    }


# ------------------------------------------------------------------ driver


def targets(line: dict[str, Any], store: str) -> dict[str, Any]:
    """The issue's targets, met or not, for this line."""
    in_process = store != "postgres"
    bound_ms = 1.0 if in_process else 10.0
    met: dict[str, Any] = {
        "busiest_second_le_25": line["gateway"]["busiest_second"] <= 25,
        "zero_429": line["gateway"]["rejected_429"] == 0,
        f"payment_start_p50_le_{bound_ms:g}ms": (line["payment_start_ms"]["p50"] or 1e9) <= bound_ms,
        f"continuation_p50_le_{bound_ms:g}ms": (line["continuation_ms"]["p50"] or 1e9) <= bound_ms,
        "stock_5_orders_20_refusals": (line["stock"]["orders"], line["stock"]["refused"]) == (UNITS, BUYERS - UNITS),
        "no_orphan_jobs": line["orphan_jobs"] == 0,
        "one_charge_per_order": line["charges"]["charged_once"] == line["charges"]["orders"],
        "every_job_terminal": line["jobs_not_terminal"] == 0,
    }
    export = line.get("export")
    if export is not None:
        if store == "postgres":
            met["resume_le_lease_plus_2s"] = export["kill_to_resume_s"] <= line["lease_s"] + 2.0
        else:
            met["resume_le_2s_after_restart"] = export["restart_to_resume_s"] <= 2.0
    return met


def run_store(args: argparse.Namespace) -> dict[str, Any]:
    """One run on ``args.store``; the JSON line."""
    common = {"section": "shop", "store": args.store, "orders": args.orders, "clients": args.clients}
    common["think_s"] = args.think
    if args.store == "postgres":
        with pg_server(args.dsn) as (cluster, where):
            line = trio.run(run_postgres, cluster, args.orders, args.clients, args.think, args.seed, args.lease)
        common["server"] = where
    else:
        with tempfile.TemporaryDirectory(prefix="trioq-shop-") as tmp:
            directory = Path(tmp)
            line = trio.run(run_inprocess, args.store, args.orders, args.clients, args.think, args.seed, directory)
            if args.store == "wal":
                line["export"] = wal_export_kill(
                    directory, batch=EXPORT_BATCH, pause=EXPORT_PAUSE, kill_after=KILL_AFTER_ROWS
                )
    out = {**common, **line}
    out["targets_met"] = targets(out, args.store)
    return out


def table(path: Path) -> str:
    """The docs' markdown table from the last line of each store in ``path``."""
    last: dict[str, dict[str, Any]] = {}
    for raw in path.read_text().splitlines():
        line = json.loads(raw)
        if line.get("section") == "shop":
            last[line["store"]] = line
    stores = [s for s in ("memory", "wal", "postgres") if s in last]

    def cell(store: str, fn: Callable[[dict[str, Any]], str]) -> str:
        try:
            return fn(last[store])
        except (KeyError, TypeError):
            return "—"

    rows: list[tuple[str, Callable[[dict[str, Any]], str], str]] = [
        ("busiest second at the gateway (requests)", lambda x: str(x["gateway"]["busiest_second"]),
         KILN["busiest_second"]),
        ("429s from the gateway", lambda x: str(x["gateway"]["rejected_429"]), "v0.4.0: 0"),
        ("the same, limit row locked 1 s mid-run", lambda x: "held {:.1f} s; the run's figures above".format(
            x["limit_row_lock"]["held_s"]), "—"),
        ("payment job enqueue → start, p50 (p90)", lambda x: "{} ms ({} ms)".format(
            x["payment_start_ms"]["p50"], x["payment_start_ms"]["p90"]), KILN["payment_start_p50_ms"]),
        ("parent done → child start, p50 (p90)", lambda x: "{} ms ({} ms)".format(
            x["continuation_ms"]["p50"], x["continuation_ms"]["p90"]), KILN["continuation_p50_ms"]),
        ("25 buyers, 5 units: orders / refusals / jobs left behind", lambda x: "{} / {} / {}".format(
            x["stock"]["orders"], x["stock"]["refused"], x["orphan_jobs"]), "—"),
        ("orders charged exactly once (gateway requests, charge attempts)", lambda x: "{} of {} ({}, {})".format(
            x["charges"]["charged_once"], x["charges"]["orders"], x["gateway"]["requests"],
            x["charges"]["charge_attempts"]), "—"),
        ("export resumed after kill -9", lambda x: (
            "{} s after the kill (lease {:g} s)".format(x["export"]["kill_to_resume_s"], x["lease_s"])
            if x["store"] == "postgres" else "{} s after the restart ({} s after the kill)".format(
                x["export"]["restart_to_resume_s"], x["export"]["kill_to_resume_s"])), KILN["resume_s"]),
    ]  # fmt: skip
    header = "| figure | " + " | ".join(stores) + " | kiln |\n|---|" + "---|" * len(stores) + "---|\n"
    body = "".join(
        f"| {name} | " + " | ".join(cell(s, fn) for s in stores) + f" | {kiln} |\n" for name, fn, kiln in rows
    )
    return header + body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("memory", "wal", "postgres"), default="memory")
    parser.add_argument("--orders", type=int, default=150)
    parser.add_argument("--clients", type=int, default=15)
    parser.add_argument("--think", type=float, default=1.0, help="mean seconds between a client's orders")
    parser.add_argument("--lease", type=float, default=5.0, help="PostgreSQL nodes' lease (seconds)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dsn", help="PostgreSQL server to use (default: a throwaway cluster)")
    parser.add_argument("--no-save", action="store_true", help=f"do not append to {RESULTS.relative_to(_ROOT)}")
    parser.add_argument("--table", type=Path, help="print the docs' table from this results file, and stop")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, directory, batch, pause, *rest = args.child
        assert kind == "wal-export", kind
        trio.run(_wal_export_child, Path(directory), int(batch), float(pause), "--enqueue" in rest)
        return
    if args.table:
        print(table(args.table), end="")
        return
    logging.getLogger("trioq").setLevel(logging.CRITICAL)  # the gateway's 503s are expected: no tracebacks
    env = env_line(False, store=args.store)
    print(json.dumps(env), flush=True)
    line = run_store(args)
    print(json.dumps(line), flush=True)
    if not args.no_save:
        with RESULTS.open("a") as f:
            f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
