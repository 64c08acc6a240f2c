"""Core throughput and latency of trioq, each figure beside a bare-trio baseline.

Run from the repository root::

    python benchmarks/core.py            # full run, about 2.5 minutes on 2 cores
    python benchmarks/core.py --quick    # smoke test, well under 20 seconds
    python benchmarks/core.py --only latency

Every measurement is one JSON line on stdout (progress goes to stderr). A trioq
figure is always measured in the same run as its baseline, alternating trioq
and baseline over several rounds and reporting medians, and the line carries
the ratio, the target and whether it was met. Sections:

``noop_drain``
    N no-op async jobs on a ``MemoryStore``, 100 workers, against 100 tasks
    draining a prefilled trio memory channel. Jobs are enqueued first through a
    producer-only queue (``workers=0``); the drain is then timed from opening a
    second queue with 100 workers on the same store until ``join()`` returns.
    The enqueue rate (time inside ``enqueue_many`` only) is its own line.
``sleep_bound``
    Jobs that each ``await trio.sleep(0.020)``, at 16 and 64 workers, against a
    bare channel drained by as many tasks with the same sleep; the ideal is
    ``workers / 0.020`` jobs/s. Every queue here runs with
    ``precise_timers=True`` (as ``trioq serve`` does) and the baseline with the
    same timerfd wake-ups (``trioq._runtime.wakeups``), so the ratio is trioq's own
    cost; the same drain on plain trio (deadlines woken at whole
    milliseconds) is reported beside it as ``plain_trio_*``.
``latency``
    An idle pool of 16 workers gets one job every ~1 ms; the latency is the
    handler's first ``perf_counter()`` minus the one taken just before
    ``await queue.enqueue(...)`` (carried in the payload). The baseline sends
    the same timestamp down a channel to 16 idle receiving tasks.
``growth``
    Enqueue rate, drain rate and resident memory per queued job at several
    queue sizes, each size in a fresh subprocess of this script. Memory per job
    is the RSS growth (``/proc/self/statm``, after ``gc.collect()``) across
    enqueueing N jobs into a producer-only queue, divided by N. Rates are
    compared with the smallest size; a bare channel's drain at the same N is
    measured after trioq in the same subprocess, for context. A drain is cut
    off after 60 s (5 s with ``--quick``) so a pathological slowdown cannot
    stall the run; the line then says ``drain_complete: false`` and the rate is
    the jobs that succeeded over the time taken. Enqueues go in batches of
    1,000 (see ``GROWTH_BATCH``). Smaller sizes get more rounds (5, 5, 3):
    10,000 jobs enqueue in ~40 ms, and their median needs them. A last line
    drains the largest size again with ``max_retained`` at its size: the
    default evicts a finished job per job past 100,000, which is
    where the drain rate bends.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import math
import os
import sys
from pathlib import Path
from typing import Any

import trio

# benchmarks/ is sys.path[0] when this runs as a script; importing _common puts the
# repository root ahead of any installed trioq, so the working tree is what is measured.
from _common import (
    BATCH,
    SLEEP,
    GcClock,
    arg_parser,
    bare_worker,
    drain_channel,
    emit,
    env_line,
    fill,
    logger,
    median,
    percentile,
    perf_counter,
    prefilled_channel,
    r3,
    registry,
    run,
    run_json,
    versus_bare,
)

import trioq

#: ``open_queue``'s bound on retained finished jobs: a drain past it evicts one per job.
DEFAULT_MAX_RETAINED: int = inspect.signature(trioq.open_queue).parameters["max_retained"].default

SECTIONS = ("noop_drain", "sleep_bound", "latency", "growth")

REGISTRY = registry()  # noop, sleepy, and stamp below
_SAMPLES: list[float] = []
log = logger("core")


@REGISTRY.task
async def stamp(ctx: trioq.JobContext, t: float) -> None:
    _SAMPLES.append(perf_counter() - t)


# ---------------------------------------------------------------- plumbing


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------- trioq side


async def trioq_drain(
    task: str,
    n: int,
    workers: int,
    limit: float = math.inf,
    max_retained: int = DEFAULT_MAX_RETAINED,
    batch: int = BATCH,
) -> dict[str, Any]:
    """Enqueue through a producer-only queue, then time a ``workers`` queue draining it.

    With a finite ``limit`` the drain is cut off after that many seconds and the
    rate is the number of jobs that succeeded by then over the time taken.
    ``max_retained`` is the queue's (``open_queue``'s default unless given).
    """
    store = trioq.MemoryStore()
    async with trioq.open_queue(
        REGISTRY, store=store, workers=0, max_retained=max_retained, precise_timers=True
    ) as producer:
        gc.collect()
        rss_before = rss_bytes()
        with GcClock() as enqueue_gc:
            enqueue_s = await fill(producer, task, n, batch, gc_clock=enqueue_gc)
        gc.collect()
        rss_after = rss_bytes()
    gc.collect()
    with GcClock() as drain_gc:
        t0 = perf_counter()
        async with trioq.open_queue(
            REGISTRY, store=store, workers=workers, max_retained=max_retained, precise_timers=True
        ) as queue:
            with trio.move_on_after(limit):
                await queue.join()
            drain_s = perf_counter() - t0
            done = (await queue.stats())["totals"]["succeeded"]
    assert done == n or limit < math.inf, (done, n)
    return {
        "enqueue_s": enqueue_s,
        "drain_s": drain_s,
        "drained": done,
        "rss_before": rss_before,
        "rss_after": rss_after,
        "enqueue_gc_s": enqueue_gc.inside,
        "enqueue_full_gcs": enqueue_gc.full,
        "drain_gc_s": drain_gc.seconds,
        "drain_full_gcs": drain_gc.full,
    }


# -------------------------------------------------------------- bare side


async def _bare_noop(item: Any) -> None:
    pass


async def _bare_sleep(item: Any) -> None:
    await trio.sleep(SLEEP)


async def bare_drain(n: int, workers: int, sleep: bool, precise_wakeups: bool = False) -> dict[str, float]:
    """Prefill a memory channel with ``n`` items, then time ``workers`` tasks draining it."""
    receive, fill_s = prefilled_channel(n)
    handler = _bare_sleep if sleep else _bare_noop
    gc.collect()
    drain_s = await drain_channel(receive, workers, handler, precise_wakeups=precise_wakeups)
    return {"enqueue_s": fill_s, "drain_s": drain_s}


# ---------------------------------------------------------------- sections


def section_noop_drain(n: int, workers: int, rounds: int) -> None:
    tq: list[dict[str, Any]] = []
    bare: list[dict[str, float]] = []
    for i in range(rounds):
        log(f"noop_drain round {i + 1}/{rounds}: {n} jobs, {workers} workers")
        tq.append(run(trioq_drain, "noop", n, workers))
        bare.append(run(bare_drain, n, workers, False))
    tq_enq = [n / r["enqueue_s"] for r in tq]
    bare_enq = [n / r["enqueue_s"] for r in bare]
    emit(
        {
            "section": "noop_drain",
            "metric": "enqueue_rate",
            "jobs": n,
            "batch": BATCH,
            "trioq_jobs_per_s": r3(median(tq_enq)),
            "bare_items_per_s": r3(median(bare_enq)),
            "ratio": r3(median(tq_enq) / median(bare_enq)),
            "trioq_rounds": [r3(x) for x in tq_enq],
            "bare_rounds": [r3(x) for x in bare_enq],
            "method": "trioq: time inside queue.enqueue_many (batches of 10,000 JobSpecs, MemoryStore, workers=0); "
            "bare: send_nowait of prebuilt items into a memory channel; median of rounds; no target",
        }
    )
    tq_rate = [n / r["drain_s"] for r in tq]
    bare_rate = [n / r["drain_s"] for r in bare]
    ratio = median(tq_rate) / median(bare_rate)
    emit(
        {
            "section": "noop_drain",
            "metric": "drain_rate",
            "jobs": n,
            "workers": workers,
            "trioq_jobs_per_s": r3(median(tq_rate)),
            "bare_jobs_per_s": r3(median(bare_rate)),
            "ratio": r3(ratio),
            "target": ">= 0.30",
            "met": ratio >= 0.30,
            "trioq_rounds": [r3(x) for x in tq_rate],
            "bare_rounds": [r3(x) for x in bare_rate],
            "trioq_drain_gc_share": r3(median([r["drain_gc_s"] / r["drain_s"] for r in tq])),
            "method": "trioq: jobs enqueued via a workers=0 queue on a MemoryStore, then timed from entering "
            "open_queue(workers=100) on the same store until join() returns; bare: prefilled trio memory "
            "channel drained by 100 tasks (async for + no-op async handler), timed from spawning them until the "
            "nursery exits; trioq and bare alternate, median of rounds",
        }
    )


def section_sleep_bound(n: int, widths: tuple[int, ...], rounds: int) -> None:
    for workers in widths:
        tq: list[float] = []
        bare: list[float] = []
        plain: list[float] = []
        for i in range(rounds):
            log(f"sleep_bound {workers} workers round {i + 1}/{rounds}: {n} jobs")
            tq.append(n / run(trioq_drain, "sleepy", n, workers)["drain_s"])
            bare.append(n / run(bare_drain, n, workers, True, True)["drain_s"])
            plain.append(n / run(bare_drain, n, workers, True, False)["drain_s"])
        emit(
            {
                "section": "sleep_bound",
                "metric": "throughput",
                "jobs": n,
                "workers": workers,
                "sleep_s": SLEEP,
                "trioq_jobs_per_s": r3(median(tq)),
                "bare_jobs_per_s": r3(median(bare)),
                **versus_bare(tq, bare, workers / SLEEP, least=0.97, target=">= 0.97"),
                "plain_trio_jobs_per_s": r3(median(plain)),
                "plain_trio_vs_ideal": r3(median(plain) / (workers / SLEEP)),
                "plain_trio_rounds": [r3(x) for x in plain],
                "method": "as noop_drain (enqueue via workers=0 queue, time open_queue(workers=W) to join()); "
                "bare channel drained by W tasks with the same sleep, beside the timerfd wake-ups the queue "
                "runs (precise_timers=True, trioq._runtime.wakeups); plain_trio: the same bare drain without them; "
                "alternating, median of rounds",
            }
        )


async def trioq_latency(n: int, warmup: int, workers: int) -> list[float]:
    _SAMPLES.clear()
    async with trioq.open_queue(REGISTRY, workers=workers, precise_timers=True) as queue:
        await trio.sleep(0.05)  # let every worker park: the pool is idle
        for _ in range(warmup + n):
            t = perf_counter()
            await queue.enqueue("stamp", {"t": t})
            await trio.sleep(0.001)
        await queue.join()
    assert len(_SAMPLES) == warmup + n
    return _SAMPLES[warmup:]


async def bare_latency(n: int, warmup: int, workers: int) -> list[float]:
    samples: list[float] = []

    async def handler(t: float) -> None:
        samples.append(perf_counter() - t)

    send, receive = trio.open_memory_channel[float](math.inf)
    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(bare_worker, receive, handler)
        await trio.sleep(0.05)
        for _ in range(warmup + n):
            t = perf_counter()
            await send.send(t)
            await trio.sleep(0.001)
        send.close()
    assert len(samples) == warmup + n
    return samples[warmup:]


def section_latency(n: int, workers: int, rounds: int, warmup: int = 20) -> None:
    tq: list[list[float]] = []
    bare: list[list[float]] = []
    for i in range(rounds):
        log(f"latency round {i + 1}/{rounds}: {n} jobs ~1 ms apart, {workers} idle workers")
        tq.append(run(trioq_latency, n, warmup, workers))
        bare.append(run(bare_latency, n, warmup, workers))
    all_tq = [x for r in tq for x in r]
    all_bare = [x for r in bare for x in r]
    ms = 1000.0
    tq_p50, tq_p99 = percentile(all_tq, 50) * ms, percentile(all_tq, 99) * ms
    bare_p50, bare_p99 = percentile(all_bare, 50) * ms, percentile(all_bare, 99) * ms
    emit(
        {
            "section": "latency",
            "metric": "enqueue_to_handler_start_ms",
            "jobs": n,
            "rounds": rounds,
            "workers": workers,
            "trioq_p50_ms": r3(tq_p50),
            "trioq_p99_ms": r3(tq_p99),
            "trioq_max_ms": r3(max(all_tq) * ms),
            "bare_p50_ms": r3(bare_p50),
            "bare_p99_ms": r3(bare_p99),
            "bare_max_ms": r3(max(all_bare) * ms),
            "p50_ratio": r3(tq_p50 / bare_p50),
            "p99_ratio": r3(tq_p99 / bare_p99),
            "target": "trioq p50 < 0.2 ms, p99 < 2 ms",
            "met": tq_p50 < 0.2 and tq_p99 < 2.0,
            "trioq_rounds_p50_p99_ms": [[r3(percentile(r, 50) * ms), r3(percentile(r, 99) * ms)] for r in tq],
            "bare_rounds_p50_p99_ms": [[r3(percentile(r, 50) * ms), r3(percentile(r, 99) * ms)] for r in bare],
            "method": f"perf_counter() just before `await queue.enqueue('stamp', {{'t': t}})` (resp. "
            f"`await send.send(t)` to {workers} idle receiver tasks), read first thing in the handler; "
            f"`await trio.sleep(0.001)` between jobs; {warmup} warm-up jobs per round dropped; "
            "percentiles over all rounds pooled (nearest rank); trioq and bare alternate",
        }
    )


#: Jobs per enqueue_many call in the growth section: small enough that even the
#: smallest size of a full run spans ten calls. With 10,000 the smallest size was one ~40 ms
#: call that never met a full collection of the cyclic GC (every few batches
#: in a long run: the caller's JobSpecs and the returned Jobs set its pace),
#: so it measured a different regime from the larger sizes.
GROWTH_BATCH = 1_000


def growth_child(n: int, workers: int, limit: float, max_retained: int) -> dict[str, Any]:
    """Runs in a fresh subprocess: one size, trioq first, then the bare drain."""
    out: dict[str, Any] = run(trioq_drain, "noop", n, workers, limit, max_retained, GROWTH_BATCH)
    out["bare_drain_s"] = run(bare_drain, n, workers, False)["drain_s"]
    return out


def growth_command(n: int, workers: int, limit: float, max_retained: int = DEFAULT_MAX_RETAINED) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--growth-child", str(n)]
    return [*command, "--workers", str(workers), "--drain-limit", str(limit), "--max-retained", str(max_retained)]


def section_growth(sizes: tuple[int, ...], rounds: dict[int, int], workers: int, limit: float) -> None:
    results: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    for i in range(max(rounds.values())):
        for n in sizes:
            if i >= rounds[n]:
                continue
            log(f"growth round {i + 1}/{rounds[n]}: {n} jobs (subprocess)")
            results[n].append(run_json(growth_command(n, workers, limit)))
    summary: dict[int, dict[str, Any]] = {}
    for n in sizes:
        rs = results[n]
        summary[n] = {
            "enqueue": median([n / r["enqueue_s"] for r in rs]),
            "drain": median([r["drained"] / r["drain_s"] for r in rs]),
            "complete": all(r["drained"] == n for r in rs),
            "drained": [r["drained"] for r in rs],
            "bare_drain": median([n / r["bare_drain_s"] for r in rs]),
            "bytes_per_job": median([(r["rss_after"] - r["rss_before"]) / n for r in rs]),
            "enqueue_gc_share": median([r["enqueue_gc_s"] / r["enqueue_s"] for r in rs]),
            "enqueue_full_gcs": median([r["enqueue_full_gcs"] for r in rs]),
            "drain_gc_share": median([r["drain_gc_s"] / r["drain_s"] for r in rs]),
            "drain_full_gcs": median([r["drain_full_gcs"] for r in rs]),
        }
    base = summary[sizes[0]]
    for n in sizes:
        s = summary[n]
        line: dict[str, Any] = {
            "section": "growth",
            "metric": "size",
            "jobs": n,
            "workers": workers,
            "rounds": rounds[n],
            "enqueue_jobs_per_s": r3(s["enqueue"]),
            "drain_jobs_per_s": r3(s["drain"]),
            "drain_complete": s["complete"],
            "bare_drain_jobs_per_s": r3(s["bare_drain"]),
            "drain_ratio_vs_bare": r3(s["drain"] / s["bare_drain"]),
            f"enqueue_vs_{sizes[0]}": r3(s["enqueue"] / base["enqueue"]),
            f"drain_vs_{sizes[0]}": r3(s["drain"] / base["drain"]),
            "bytes_per_job": round(s["bytes_per_job"], 1),
            "enqueue_gc_share": r3(s["enqueue_gc_share"]),
            "enqueue_full_gcs": s["enqueue_full_gcs"],
            "drain_gc_share": r3(s["drain_gc_share"]),
            "drain_full_gcs": s["drain_full_gcs"],
            "target": "< 1024 bytes per job",
            "met": s["bytes_per_job"] < 1024,
        }
        if not s["complete"]:
            line["drained_jobs"] = s["drained"]
        line["method"] = (
            "fresh subprocess per size and round; RSS from /proc/self/statm after gc.collect(), before and after "
            f"enqueue_many (batches of {GROWTH_BATCH:,}) into a workers=0 queue on a MemoryStore; drain timed as in "
            "noop_drain, "
            f"cut off after {limit:g} s (then rate = jobs succeeded / time); *_gc_share = time in the cyclic GC "
            "(gc.callbacks) / timed span; bare channel drain measured after trioq in the same subprocess"
        )
        emit(line)
    flat: dict[str, Any] = {"section": "growth", "metric": "flatness", "sizes": list(sizes)}
    ok = True
    for key in ("enqueue", "drain"):
        rates = [summary[n][key] for n in sizes]
        spread = max(rates) / min(rates) - 1
        flat[f"{key}_spread"] = r3(spread)
        ok = ok and spread <= 0.20
    bare_rates = [summary[n]["bare_drain"] for n in sizes]
    flat["bare_drain_spread"] = r3(max(bare_rates) / min(bare_rates) - 1)
    flat["max_bytes_per_job"] = round(max(summary[n]["bytes_per_job"] for n in sizes), 1)
    flat["target"] = "rates within 20% across sizes (max/min - 1 <= 0.20), < 1024 bytes per job"
    flat["met"] = ok and flat["max_bytes_per_job"] < 1024
    emit(flat)
    # Where the drain bends: past max_retained every finished job evicts the
    # oldest one (a dict delete and frees on memory long out of the caches).
    # The same drain with room to retain every job shows what that costs.
    largest = sizes[-1]
    if largest <= DEFAULT_MAX_RETAINED:
        return  # --quick: no size is past the default bound, nothing is evicted
    log(f"growth: {largest} jobs with max_retained={largest} (subprocess)")
    rs = [run_json(growth_command(largest, workers, limit, largest)) for _ in range(rounds[largest])]
    unbounded = median([r["drained"] / r["drain_s"] for r in rs])
    emit(
        {
            "section": "growth",
            "metric": "drain_without_eviction",
            "jobs": largest,
            "max_retained": largest,
            "rounds": len(rs),
            "drain_jobs_per_s": r3(unbounded),
            f"drain_vs_{sizes[0]}": r3(unbounded / summary[sizes[0]]["drain"]),
            "default_max_retained_drain_jobs_per_s": r3(summary[largest]["drain"]),
            "eviction_share": r3(1 - summary[largest]["drain"] / unbounded),
            "method": "as the growth line of this size, but max_retained = jobs, so no finished job is evicted "
            "during the drain (a diagnostic, not a target)",
        }
    )


# --------------------------------------------------------------------- main


def main() -> None:
    parser = arg_parser(__doc__, SECTIONS, quick_help="small sizes: a smoke test in under 20 s")
    parser.add_argument("--growth-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--drain-limit", type=float, default=math.inf, help=argparse.SUPPRESS)
    parser.add_argument("--max-retained", type=int, default=DEFAULT_MAX_RETAINED, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.growth_child is not None:
        emit(growth_child(args.growth_child, args.workers, args.drain_limit, args.max_retained))
        return

    quick = args.quick
    emit(env_line(quick))
    sections = (args.only,) if args.only else SECTIONS
    started = perf_counter()
    for name in sections:
        if name == "noop_drain":
            section_noop_drain(n=10_000 if quick else 100_000, workers=100, rounds=3)
        elif name == "sleep_bound":
            section_sleep_bound(n=200 if quick else 2_000, widths=(16, 64), rounds=3 if not quick else 2)
        elif name == "latency":
            section_latency(n=200 if quick else 1_000, workers=16, rounds=3 if not quick else 2)
        elif name == "growth":
            sizes = (1_000, 10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
            rounds = dict.fromkeys(sizes, 1) if quick else {10_000: 5, 100_000: 5, 1_000_000: 3}
            section_growth(sizes, rounds, workers=100, limit=5.0 if quick else 60.0)
    log(f"done in {perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
