"""What the benchmark scripts (``core.py``, ``wal.py``, ``seed_orchd.py``, ``shop.py``, ``soak``) share.

The scripts import this module as ``_common``: run as ``python benchmarks/X.py``
(from any directory), Python puts ``benchmarks/`` first on ``sys.path``.
Importing it puts the repository root first on ``sys.path``, so the ``trioq``
benchmarked is the working tree this file sits in, whatever is installed.

Conventions the pieces keep: every measurement is one JSON line on stdout
(:func:`emit`), progress goes to stderr (:func:`logger`), the first line is the
``env`` line (:func:`env_line`), figures are medians of rounds (:func:`median`)
rounded to four significant digits (:func:`r3`), and a trioq figure is compared
with a bare trio memory channel drained by as many tasks
(:func:`prefilled_channel`, :func:`drain_channel`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

#: The repository root: the working tree whose ``trioq`` is benchmarked.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

import trioq  # noqa: E402
from trioq._runtime import wakeups as _wakeups  # noqa: E402

perf_counter = time.perf_counter

#: How long the ``sleepy`` task sleeps, in seconds.
SLEEP = 0.020
#: Jobs per ``enqueue_many`` call in :func:`fill`.
BATCH = 10_000


# ------------------------------------------------------------------ output


def emit(line: dict[str, Any]) -> None:
    """Print one JSON line on stdout and flush it (measurements, and a child process's answer)."""
    print(json.dumps(line), flush=True)


def logger(name: str) -> Callable[[str], None]:
    """A ``log(message)`` that writes ``[name] message`` to stderr: progress, kept out of the JSON on stdout."""

    def log(message: str) -> None:
        print(f"[{name}] {message}", file=sys.stderr, flush=True)

    return log


def env_line(quick: bool, **extra: Any) -> dict[str, Any]:
    """The ``env`` line a run prints first: versions and CPUs, then ``extra`` in the order given, then ``quick``."""
    return {
        "section": "env",
        "python": platform.python_version(),
        "trio": trio.__version__,
        "trioq": trioq.__version__,
        "cpus": os.cpu_count(),
        **extra,
        "quick": quick,
    }


def arg_parser(doc: str, sections: tuple[str, ...], quick_help: str) -> argparse.ArgumentParser:
    """The flags every script takes: ``--quick`` (help text ``quick_help``) and ``--only`` one of ``sections``.

    The description is the first paragraph of ``doc`` (the script's docstring);
    a script adds its own (hidden) child-process flags to the parser returned.
    """
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--only", choices=sections, help="run one section")
    return parser


# -------------------------------------------------------------- statistics


def median(values: list[float]) -> float:
    """The median of ``values`` (``statistics.median``)."""
    return statistics.median(values)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100; the rank is exact for a whole-number q)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def r3(x: float) -> float:
    """``x`` rounded to four significant digits, as a float (the precision of every reported figure)."""
    return float(f"{x:.4g}")


def versus_bare(tq: list[float], bare: list[float], ideal: float, *, least: float, target: str) -> dict[str, Any]:
    """The keys of a throughput line that set trioq's rates beside the bare channel's and the ideal.

    ``tq`` and ``bare`` are the per-round rates (jobs/s), ``ideal`` the rate the
    work allows; ``met`` is ``ratio >= least`` and ``target`` says so in words.
    The keys, in this order: ``ideal_jobs_per_s``, ``ratio`` (median trioq /
    median bare), ``trioq_vs_ideal``, ``bare_vs_ideal``, ``target``, ``met``,
    ``trioq_rounds``, ``bare_rounds``.
    """
    ratio = median(tq) / median(bare)
    return {
        "ideal_jobs_per_s": r3(ideal),
        "ratio": r3(ratio),
        "trioq_vs_ideal": r3(median(tq) / ideal),
        "bare_vs_ideal": r3(median(bare) / ideal),
        "target": target,
        "met": ratio >= least,
        "trioq_rounds": [r3(x) for x in tq],
        "bare_rounds": [r3(x) for x in bare],
    }


# --------------------------------------------------------------- processes


def run(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    """One measurement in a fresh trio run, after a full collection."""
    gc.collect()
    return trio.run(fn, *args)


def run_json(command: list[str], *, cwd: str | Path | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Run ``command`` to completion (a non-zero exit raises); the JSON object on the last line of its stdout."""
    proc = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, text=True, timeout=timeout, check=True)
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


class GcClock:
    """Seconds spent in the cyclic garbage collector while installed, and full collections.

    Use as a context manager (it hooks ``gc.callbacks`` inside the ``with``).
    ``inside`` is for callers that count only part of that time: :func:`fill`
    adds the collector time within its timed calls to it.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self.inside = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = perf_counter()
        else:
            self.seconds += perf_counter() - self._t0
            self.full += info["generation"] == 2

    def __enter__(self) -> GcClock:
        self.inside = 0.0
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


# ------------------------------------------------------------- trioq side


async def noop(ctx: trioq.JobContext) -> None:
    """The ``noop`` task: does nothing."""


async def sleepy(ctx: trioq.JobContext) -> None:
    """The ``sleepy`` task: ``await trio.sleep(SLEEP)``."""
    await trio.sleep(SLEEP)


def registry() -> trioq.Registry:
    """A new registry holding the ``noop`` and ``sleepy`` tasks; a script registers its own tasks on it too."""
    reg = trioq.Registry()
    reg.task(noop)
    reg.task(sleepy)
    return reg


async def fill(queue: trioq.Queue, task: str, n: int, batch: int = BATCH, gc_clock: GcClock | None = None) -> float:
    """Enqueue ``n`` jobs with ``enqueue_many`` in batches; seconds spent inside it.

    Building the ``JobSpec`` lists is not timed; validation and the store are.
    With ``gc_clock``, its ``inside`` counts only collector time within the timed calls.
    """
    spent = 0.0
    done = 0
    while done < n:
        k = min(batch, n - done)
        specs = [trioq.JobSpec(task) for _ in range(k)]
        g0 = gc_clock.seconds if gc_clock is not None else 0.0
        t0 = perf_counter()
        await queue.enqueue_many(specs)
        spent += perf_counter() - t0
        if gc_clock is not None:
            gc_clock.inside += gc_clock.seconds - g0
        done += k
    return spent


# -------------------------------------------------------------- bare side


def prefilled_channel(n: int) -> tuple[trio.MemoryReceiveChannel[Any], float]:
    """A closed trio memory channel holding ``n`` empty dicts, and the seconds its ``send_nowait`` calls took.

    The items are built before the clock starts, so only the channel is timed.
    """
    send, receive = trio.open_memory_channel[Any](n)
    items: list[dict[str, Any]] = [{} for _ in range(n)]
    t0 = perf_counter()
    for item in items:
        send.send_nowait(item)
    fill_s = perf_counter() - t0
    send.close()
    return receive, fill_s


async def bare_worker(receive: trio.MemoryReceiveChannel[Any], handler: Callable[[Any], Awaitable[None]]) -> None:
    """A baseline worker: ``await handler(item)`` for every item, until the channel is closed and empty."""
    async for item in receive:
        await handler(item)


async def drain_channel(
    receive: trio.MemoryReceiveChannel[Any],
    workers: int,
    handler: Callable[[Any], Awaitable[None]],
    *,
    precise_wakeups: bool = False,
) -> float:
    """Seconds for ``workers`` :func:`bare_worker` tasks to drain ``receive``.

    Timed from spawning the tasks until the nursery exits. ``precise_wakeups``
    runs trioq's timerfd wake-ups (``trioq._runtime.wakeups``, which every open queue
    runs) beside them, so a baseline of sleeping handlers gets the same timers
    trioq's workers get.
    """
    async with _wakeups.precise_wakeups() if precise_wakeups else contextlib.nullcontext():
        t0 = perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(workers):
                nursery.start_soon(bare_worker, receive, handler)
        elapsed = perf_counter() - t0
    return elapsed


@contextlib.contextmanager
def pg_server(dsn: str | None) -> Iterator[tuple[Any, str]]:
    """``(cluster, where)``: ``dsn``'s server, else ``TRIOQ_PG_DSN``'s (an ``ExternalCluster``, never
    stopped nor restarted), else a throwaway cluster from the Debian binaries (``tests/pgcluster.py``),
    stopped on the way out. Each makes fresh databases (``create_database``) and has a ``dsn`` of its
    own; ``where`` says which it is, for the JSON line."""
    from tests.pgcluster import DSN_ENV, ExternalCluster, start_cluster

    if dsn:
        yield ExternalCluster(dsn), "--dsn"
        return
    cluster = start_cluster()
    if cluster is None:
        raise SystemExit(f"no PostgreSQL binaries found (initdb, pg_ctl); pass --dsn or set {DSN_ENV}")
    try:
        yield cluster, DSN_ENV if isinstance(cluster, ExternalCluster) else "throwaway cluster (tests/pgcluster.py)"
    finally:
        cluster.stop()
