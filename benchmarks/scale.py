"""How trioq's costs grow from 10k to 1M jobs, in memory and in a durable WAL.

Run from the repository root::

    python benchmarks/scale.py            # 10k, 100k, 1M jobs x {memory, wal-always}: ~2 minutes
    python benchmarks/scale.py --quick    # 10k and 50k only

Each (store, size) runs in a fresh child process (a real restart for the WAL):

1. ``open_queue(workers=0)`` on the store, then ``enqueue_many`` of ``n`` no-op
   jobs in batches of 10,000: ``enqueue_per_s`` (time inside ``enqueue_many``).
2. WAL only: the queue closes; ``wal_bytes_per_job`` is the log's size on disk
   divided by ``n``; a new ``WALStore`` on the directory is opened:
   ``recovery_s`` is the time from entering ``open_queue`` until its body runs
   (replaying ``n`` ADD records and rebuilding the table).
3. A queue with 100 workers drains the jobs: ``drain_per_s``, from the start of
   its body until ``join()`` returns.
4. ``peak_rss_mib`` is the child's peak resident set (``ru_maxrss``), and
   ``rss_per_job_bytes`` the growth of the resident set over the process's
   baseline after the jobs were enqueued, divided by ``n``.

The last line (``flatness``) compares each rate at the largest size with the
smallest: a spread of 0 is perfectly flat.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import arg_parser, emit, env_line, fill, logger, perf_counter, r3, registry, run_json

import trioq

log = logger("scale")
STORES = ("memory", "wal-always")
WORKERS = 100


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def du(directory: str) -> int:
    return sum(entry.stat().st_size for entry in os.scandir(directory) if entry.name.endswith(".wal"))


async def child(store_kind: str, n: int, directory: str) -> dict[str, Any]:
    reg = registry()
    gc.collect()
    base_rss = rss_bytes()
    line: dict[str, Any] = {"section": "scale", "store": store_kind, "jobs": n}
    store: trioq.Store = trioq.MemoryStore() if store_kind == "memory" else trioq.WALStore(directory)
    async with trioq.open_queue(reg, store=store, workers=0, precise_timers=True) as queue:
        enqueue_s = await fill(queue, "noop", n)
        gc.collect()
        line["rss_per_job_bytes"] = round((rss_bytes() - base_rss) / n, 1)
    line["enqueue_per_s"] = r3(n / enqueue_s)
    if store_kind != "memory":
        line["wal_bytes_per_job"] = round(du(directory) / n, 1)
        store = trioq.WALStore(directory)
        opened = perf_counter()
    async with trioq.open_queue(reg, store=store, workers=WORKERS, precise_timers=True) as queue:
        if store_kind != "memory":
            line["recovery_s"] = r3(perf_counter() - opened)
            line["recovery_records_per_s"] = r3(n / (perf_counter() - opened))
        started = perf_counter()
        await queue.join()
        line["drain_per_s"] = r3(n / (perf_counter() - started))
    line["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return line


def main() -> None:
    parser = arg_parser(__doc__ or "", ("scale",), "10k and 50k jobs only")
    parser.add_argument("--child", nargs=3, metavar=("STORE", "N", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import trio

        store_kind, n, directory = args.child
        emit(trio.run(child, store_kind, int(n), directory))
        return
    sizes = (10_000, 50_000) if args.quick else (10_000, 100_000, 1_000_000)
    emit(env_line(args.quick, sizes=list(sizes), workers=WORKERS))
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for n in sizes:
        for store_kind in STORES:
            directory = tempfile.mkdtemp(prefix="trioq-scale-")
            try:
                log(f"{store_kind} {n:,} jobs (child process)")
                command = [sys.executable, str(Path(__file__).resolve()), "--child", store_kind, str(n), directory]
                line = run_json(command, timeout=900)
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            results[(store_kind, n)] = line
            emit(line)
    small, large = sizes[0], sizes[-1]
    for store_kind in STORES:
        flat: dict[str, Any] = {"section": "flatness", "store": store_kind, "from": small, "to": large}
        for key in ("enqueue_per_s", "drain_per_s", "recovery_records_per_s", "rss_per_job_bytes"):
            a, b = results[(store_kind, small)].get(key), results[(store_kind, large)].get(key)
            if a and b:
                flat[f"{key}_ratio"] = r3(b / a)
        emit(flat)


if __name__ == "__main__":
    main()
