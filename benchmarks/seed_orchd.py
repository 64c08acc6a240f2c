"""orchd's three seed experiments, reproduced over HTTP against a real ``trioq serve``.

Run from the repository root::

    python benchmarks/seed_orchd.py                 # full run, about 3 minutes on 2 cores
    python benchmarks/seed_orchd.py --quick         # smoke test, about 40 s
    python benchmarks/seed_orchd.py --only throughput

Every measurement is one JSON line on stdout (progress goes to stderr). Each
measurement starts a fresh server: ``python -m trioq serve`` in a
subprocess on 127.0.0.1 and a free port, with a temporary ``--wal`` directory
and ``--fsync always``; it is killed (SIGKILL to its process group) in a
``finally`` and the directory removed. Load always comes from a *separate
process*, never from this one, so the client's CPU is not the server's:

``throughput`` (orchd experiment A)
    2,000 ``sim`` jobs of 20 ms at 1/4/16/64 workers (fewer jobs at 1 and 4
    workers to bound the run time; the line says how many), submitted by
    ``python -m trioq loadgen --batch 50 --clients 8``; its
    ``throughput_jobs_s`` (jobs succeeded / time from first submit to the queue
    seen drained; it polls ``/stats`` at half the expected time left, 5 to 500
    ms apart) is the trioq figure. The
    baseline, measured in the same run alternating with trioq, is a bare trio
    memory channel in *this* process, prefilled and drained by as many tasks
    running the same work as ``sim`` (two ``trio.sleep(0.010)`` slices), beside
    the timerfd wake-ups every open queue runs (``trioq._runtime.wakeups``). Medians
    of rounds. Target: ratio >= 0.95. orchd: 754 jobs/s (16), 2,830 (64).
``retries`` (orchd experiment B)
    2,000 ``sim`` jobs of 20 ms with ``fail_prob`` 0.2 at 64 workers, with
    retries off (``"max_attempts": 1`` in every job body) and on (the ``sim``
    default, 5 attempts, default backoff 0.5 s x 2^n with jitter). ``trioq
    loadgen`` cannot put ``max_attempts`` in a job body, so both arms are driven
    by a child process of this script (``--drive``) that posts ``/jobs/batch``
    with httpx through ``trioq._app.loadgen.submit`` and then polls ``/stats`` every
    20 ms until succeeded + dead covers every job. Completion = succeeded /
    submitted. Target: on >= 99.9%.
``hangs`` (orchd experiment C)
    1,000 ``sim`` jobs of 20 ms with ``hang_prob`` 0.01 at 64 workers, with no
    ``--heartbeat-timeout`` (hung jobs never end: the wait is bounded, 10 s,
    and completion is read at that point) and with ``--heartbeat-timeout 0.2``.
    Same driver as ``retries``; time is from the first submit to the last job
    reaching a terminal state (or the bound). Target: on = 100% in < 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import trio

# benchmarks/ is sys.path[0] when this runs as a script; importing _common puts the
# repository root ahead of any installed trioq, so the working tree is what is measured.
from _common import (
    ROOT,
    arg_parser,
    drain_channel,
    emit,
    env_line,
    logger,
    median,
    perf_counter,
    prefilled_channel,
    r3,
    run,
    run_json,
    versus_bare,
)

SECTIONS = ("throughput", "retries", "hangs")
WORK_MS = 20.0
SIM_SLICE = 0.010  # trioq._app.builtin.SIM_SLICE: sim sleeps in slices of 10 ms
ORCHD = {16: 754.0, 64: 2830.0}  # orchd's published throughput (jobs/s), experiment A

log = logger("seed_orchd")


# ------------------------------------------------------------------ server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def server(workers: int, *, heartbeat_timeout: float | None = None, fsync: str = "always") -> Iterator[str]:
    """A fresh ``trioq serve`` subprocess on a free port and a temporary WAL; yields its URL."""
    wal = tempfile.mkdtemp(prefix="trioq-seed-")
    port = free_port()
    command = [sys.executable, "-m", "trioq", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--wal", os.path.join(wal, "wal"), "--fsync", fsync, "--workers", str(workers)]
    command += ["--shutdown-grace", "0.5"]
    if heartbeat_timeout is not None:
        command += ["--heartbeat-timeout", str(heartbeat_timeout)]
    url = f"http://127.0.0.1:{port}"
    logfile = open(os.path.join(wal, "server.log"), "wb")  # noqa: SIM115 (closed in the finally)
    proc = subprocess.Popen(command, cwd=ROOT, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        import httpx

        deadline = time.monotonic() + 30.0
        while True:
            if proc.poll() is not None:
                logfile.flush()
                raise RuntimeError(f"server exited with {proc.returncode}: {Path(wal, 'server.log').read_text()}")
            try:
                if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not become ready in 30 s")
            time.sleep(0.05)
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group we created: the server and anything it spawned
        proc.wait()
        logfile.close()
        shutil.rmtree(wal, ignore_errors=True)


def loadgen(url: str, jobs: int, *, batch: int = 50, clients: int = 8, timeout: float = 120.0) -> dict[str, Any]:
    """``python -m trioq loadgen`` in its own process; its JSON line."""
    command = [sys.executable, "-m", "trioq", "loadgen", "--url", url, "--jobs", str(jobs)]
    command += ["--batch", str(batch), "--clients", str(clients), "--work-ms", str(WORK_MS)]
    command += ["--timeout", str(timeout)]
    return run_json(command, cwd=ROOT, timeout=timeout + 30.0)


def drive(url: str, **spec: Any) -> dict[str, Any]:
    """This script's ``--drive`` mode in its own process; its JSON line."""
    spec["url"] = url
    command = [sys.executable, str(Path(__file__).resolve()), "--drive", json.dumps(spec)]
    return run_json(command, cwd=ROOT, timeout=spec["bound_s"] + 60.0)


# ----------------------------------------------------------------- driver


async def drive_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Submit ``sim`` jobs over HTTP, then poll ``/stats`` until every job is terminal or the bound passes."""
    import httpx

    from trioq._app.loadgen import LoadResult, fetch_jobs, sim_jobs, submit

    n = spec["jobs"]
    jobs = sim_jobs(n, spec["work_ms"], spec.get("fail_prob", 0.0), spec.get("hang_prob", 0.0))
    if spec.get("max_attempts") is not None:
        for job in jobs:
            job["max_attempts"] = spec["max_attempts"]
    clients = spec.get("clients", 8)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    result = LoadResult()
    async with httpx.AsyncClient(base_url=spec["url"], timeout=30.0, limits=limits) as client:
        before = (await client.get("/stats")).json()["totals"]
        started = perf_counter()
        await submit(client, jobs, clients=clients, batch=spec.get("batch", 50), result=result)
        submit_s = perf_counter() - started
        drained_s: float | None = None
        while True:
            stats = (await client.get("/stats")).json()
            totals = stats["totals"]
            elapsed = perf_counter() - started
            terminal = (totals["succeeded"] - before["succeeded"]) + (totals["dead"] - before["dead"])
            if terminal >= len(result.acked):
                drained_s = elapsed
                break
            if elapsed >= spec["bound_s"]:
                break
            await trio.sleep(spec.get("poll_s", 0.02))
        # Attempts per job, after the clock stopped: which jobs needed more
        # than one (a job that hangs twice pays two detections and two backoffs).
        found = await fetch_jobs(client, list(result.acked), clients=clients) if spec.get("attempts") else {}
    by_attempts = Counter(job["attempts"] for job in found.values() if job is not None)
    delta = {k: totals[k] - before[k] for k in totals}
    done = delta["succeeded"]
    return {
        "jobs": n,
        "acked": len(result.acked),
        "done": done,
        "dead": delta["dead"],
        "unfinished": len(result.acked) - done - delta["dead"],
        "completion_pct": round(100.0 * done / n, 3),
        "drained": drained_s is not None,
        "time_s": round(drained_s if drained_s is not None else elapsed, 4),
        "submit_s": round(submit_s, 4),
        "failed_attempts": delta["failed_attempts"],
        "retried": delta["retried"],
        "hung": delta["hung"],
        "running_at_end": stats["jobs"]["running"],
        "jobs_by_attempts": {str(k): by_attempts[k] for k in sorted(by_attempts)},
    }


# -------------------------------------------------------------- baseline


async def bare_sim(n: int, workers: int) -> float:
    """A prefilled memory channel drained by ``workers`` tasks doing sim's work; seconds."""
    receive, _ = prefilled_channel(n)
    steps = round(WORK_MS / 1000.0 / SIM_SLICE)

    async def sim(item: Any) -> None:
        for _ in range(steps):
            await trio.sleep(SIM_SLICE)

    return await drain_channel(receive, workers, sim, precise_wakeups=True)


# ---------------------------------------------------------------- sections


def section_throughput(plan: dict[int, tuple[int, int]]) -> None:
    """``plan``: workers -> (jobs, rounds)."""
    for workers, (n, rounds) in plan.items():
        tq: list[float] = []
        bare: list[float] = []
        runs: list[dict[str, Any]] = []
        for i in range(rounds):
            log(f"throughput {workers} workers round {i + 1}/{rounds}: {n} jobs x {WORK_MS:g} ms")
            with server(workers) as url:
                out = loadgen(url, n, timeout=max(60.0, 3 * n * WORK_MS / 1000.0 / workers))
            if out["done"] != n:
                raise RuntimeError(f"loadgen finished {out['done']} of {n} jobs: {out}")
            runs.append(out)
            tq.append(out["throughput_jobs_s"])
            bare.append(n / run(bare_sim, n, workers))
        ideal = workers / (WORK_MS / 1000.0)
        line: dict[str, Any] = {
            "section": "throughput",
            "experiment": "A",
            "jobs": n,
            "workers": workers,
            "work_ms": WORK_MS,
            "rounds": rounds,
            "trioq_http_jobs_per_s": r3(median(tq)),
            "bare_channel_jobs_per_s": r3(median(bare)),
            **versus_bare(tq, bare, ideal, least=0.95, target="ratio >= 0.95"),
            "submit_s_rounds": [r["submit_s"] for r in runs],
            "latency_p50_ms_median": r3(median([r["latency_p50_ms"] for r in runs])),
            "latency_p99_ms_median": r3(median([r["latency_p99_ms"] for r in runs])),
        }
        if workers in ORCHD:
            line["orchd_jobs_per_s"] = ORCHD[workers]
            line["trioq_vs_orchd"] = r3(median(tq) / ORCHD[workers])
        line["method"] = (
            "fresh `trioq serve` (WAL, fsync always) per round; `python -m trioq loadgen --batch 50 --clients 8` "
            "in a separate process, throughput = its throughput_jobs_s (succeeded / first submit to drained seen, "
            "/stats polled at half the expected time left, 5-500 ms apart, so submit over HTTP and the last poll's "
            "lag are inside); bare: prefilled trio memory channel in the benchmark process drained by W tasks "
            "each doing sim's 2 x trio.sleep(0.010), beside the timerfd wake-ups every queue runs "
            "(trioq._runtime.wakeups); "
            "trioq and bare alternate, median of rounds"
        )
        emit(line)


def _pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    done = sum(r["done"] for r in runs)
    jobs = sum(r["jobs"] for r in runs)
    return {
        "completion_pct_median": r3(median([r["completion_pct"] for r in runs])),
        "completion_pct_pooled": round(100.0 * done / jobs, 3),
        "completion_pct_rounds": [r["completion_pct"] for r in runs],
        "done_rounds": [r["done"] for r in runs],
        "dead_rounds": [r["dead"] for r in runs],
        "unfinished_rounds": [r["unfinished"] for r in runs],
        "time_s_median": r3(median([r["time_s"] for r in runs])),
        "time_s_rounds": [r["time_s"] for r in runs],
        "drained_rounds": [r["drained"] for r in runs],
    }


def section_retries(n: int, workers: int, rounds: int, bound_s: float) -> None:
    arms: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(rounds):
        for arm in ("off", "on"):
            log(f"retries {arm} round {i + 1}/{rounds}: {n} jobs, fail_prob 0.2, {workers} workers")
            with server(workers) as url:
                arms[arm].append(
                    drive(
                        url,
                        jobs=n,
                        work_ms=WORK_MS,
                        fail_prob=0.2,
                        max_attempts=1 if arm == "off" else None,
                        bound_s=bound_s,
                    )
                )
    for arm, runs in arms.items():
        line: dict[str, Any] = {
            "section": "retries",
            "experiment": "B",
            "arm": arm,
            "jobs": n,
            "workers": workers,
            "work_ms": WORK_MS,
            "fail_prob": 0.2,
            "max_attempts": 1 if arm == "off" else 5,
            "rounds": rounds,
            **_pooled(runs),
            "retried_rounds": [r["retried"] for r in runs],
            "expected_completion_pct": round(100.0 * (0.8 if arm == "off" else 1 - 0.2**5), 3),
        }
        if arm == "on":
            line["target"] = "completion >= 99.9%"
            line["met"] = min(r["completion_pct"] for r in runs) >= 99.9
        line["method"] = (
            "fresh `trioq serve` (WAL, fsync always) per round; a separate driver process posts /jobs/batch (50 per "
            'request, 8 clients; off: "max_attempts": 1 in each job body, on: sim\'s default 5 with default '
            "backoff) and polls /stats every 20 ms until succeeded + dead = submitted (bound "
            f"{bound_s:g} s); completion = succeeded / submitted; time from first submit; 'met' needs every round"
        )
        emit(line)


def section_hangs(n: int, workers: int, rounds: dict[str, int], bound_off: float, bound_on: float) -> None:
    arms: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for i in range(max(rounds.values())):
        for arm in ("off", "on"):
            if i >= rounds[arm]:
                continue
            log(f"hangs {arm} round {i + 1}/{rounds[arm]}: {n} jobs, hang_prob 0.01, {workers} workers")
            with server(workers, heartbeat_timeout=0.2 if arm == "on" else None) as url:
                arms[arm].append(
                    drive(
                        url,
                        jobs=n,
                        work_ms=WORK_MS,
                        hang_prob=0.01,
                        bound_s=bound_off if arm == "off" else bound_on,
                        attempts=True,
                    )
                )
    for arm, runs in arms.items():
        line: dict[str, Any] = {
            "section": "hangs",
            "experiment": "C",
            "arm": arm,
            "jobs": n,
            "workers": workers,
            "work_ms": WORK_MS,
            "hang_prob": 0.01,
            "heartbeat_timeout_s": 0.2 if arm == "on" else None,
            "bound_s": bound_off if arm == "off" else bound_on,
            "rounds": rounds[arm],
            **_pooled(runs),
            "hung_detected_rounds": [r["hung"] for r in runs],
            "jobs_by_attempts_rounds": [r["jobs_by_attempts"] for r in runs],
        }
        if arm == "on":
            line["target"] = "completion = 100% in < 2 s"
            line["met"] = all(r["completion_pct"] == 100.0 and r["drained"] and r["time_s"] < 2.0 for r in runs)
        line["method"] = (
            "fresh `trioq serve` (WAL, fsync always) per round; off: no --heartbeat-timeout, on: "
            "--heartbeat-timeout 0.2; a separate driver process posts /jobs/batch (50 per request, 8 clients) and "
            "polls /stats every 20 ms until succeeded + dead = submitted or the bound; time = first submit to that "
            "point; 'met' needs every round; jobs_by_attempts: attempts -> jobs, fetched after the timing"
        )
        emit(line)


# --------------------------------------------------------------------- main


def main() -> None:
    parser = arg_parser(__doc__, SECTIONS, quick_help="small sizes, one round: a smoke test in about 40 s")
    parser.add_argument("--drive", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.drive is not None:
        emit(trio.run(drive_child, json.loads(args.drive)))
        return

    quick = args.quick
    emit(env_line(quick))
    sections = (args.only,) if args.only else SECTIONS
    started = perf_counter()
    for name in sections:
        if name == "throughput":
            if quick:
                plan = {1: (50, 1), 4: (200, 1), 16: (500, 1), 64: (1000, 1)}
            else:
                plan = {1: (250, 3), 4: (1000, 3), 16: (2000, 3), 64: (2000, 3)}
            section_throughput(plan)
        elif name == "retries":
            section_retries(n=500 if quick else 2000, workers=64, rounds=1 if quick else 3, bound_s=60.0)
        elif name == "hangs":
            rounds = {"off": 1, "on": 1} if quick else {"off": 1, "on": 3}
            section_hangs(n=1000, workers=64, rounds=rounds, bound_off=3.0 if quick else 10.0, bound_on=30.0)
    log(f"done in {perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
