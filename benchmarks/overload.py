"""The overload benchmark (issue 16): open-loop traces past capacity, fed identically to every queue policy.

Usage::

    python benchmarks/overload.py [--profiles 1,2,...] [--seeds 5] [--smoke] [--real [--real-profile 4]]
    python benchmarks/overload.py --table benchmarks/results/overload.jsonl   # the docs' tables

Each profile (``_overload_model.PROFILES``) has immutable traces generated from seeds before
anything is measured (written gzipped to ``benchmarks/results/overload-traces/``, their sha256 in
every output line). Each arm (a queue configuration) runs every trace in virtual time
(``trio.testing.MockClock(autojump_threshold=0)``, ``trioq.MemoryStore``): a feeder sleeps
until each arrival and enqueues the task (``trioq.QueueFull`` counts as refused); handlers
call a simulated dependency (``_overload_model.Dependency``). A task is on time when it
completed within 500 ms of its scheduled arrival; every other offered task (refused, expired,
failed, late, unfinished) is a miss. ``--real`` also runs one profile (``--real-profile``,
default 4; one seed, half length) in real time on a ``trioq.WALStore`` and reports its on-time
beside the virtual one. ``--smoke``: one seed, traces a quarter as long, every profile in virtual
time, no real-time run. Profiles 1-7 are the issue's; profile 8 puts profile 5's target to a
sustained overload.

Output: JSON lines on stdout (``_common.emit``): the ``env`` line, an ``overload_run`` line per
profile x arm x seed, an ``overload`` line per profile x arm (medians and min-max over the
seeds), an ``overload_target`` line per profile, and ``overload_real`` lines with ``--real``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing
from _common import ROOT, emit, env_line, logger, percentile, r3
from _overload_model import (
    BACKOFF,
    DRAIN,
    L0,
    MAX_ATTEMPTS,
    PROFILES,
    SLO,
    WORKERS,
    Arm,
    Dependency,
    Profile,
    Recorder,
    Trace,
    classify,
    describe,
    local_work,
    make_trace,
    pct,
    save_trace,
    spread,
)
from _overload_report import judge, markdown, summarize

import trioq

log = logger("overload")

TRACE_DIR = ROOT / "benchmarks" / "results" / "overload-traces"
#: ``--smoke``: traces this fraction of the full length.
SMOKE_SCALE = 0.25
#: ``--real``: the profile, seed and length of the real-time run on a WALStore.
REAL_PROFILE, REAL_SEED, REAL_SCALE = 4, 1, 0.5
#: Virtual seconds between samples of an adaptive cap (``stats()["limits"]["dep"]["cap"]``).
CAP_SAMPLE = 0.5


class Unavailable(Exception):
    """An arm the trioq in this tree cannot run yet (``open_queue`` or ``registry.limit`` refused an option)."""


def build_registry(arm: Arm, dependency: Dependency, recorder: Recorder) -> trioq.Registry:
    """A registry with the ``dep`` task (calls the dependency, holding the ``dep`` key under a limit arm)
    and the ``local`` task (local work only). Raises :class:`Unavailable` if the limit is refused."""
    registry = trioq.Registry()
    limits: list[str] = []
    if arm.limit is not None:
        cap: int | trioq.Adaptive = trioq.Adaptive(min=1, max=8) if arm.limit == "adaptive" else int(arm.limit)
        try:
            registry.limit("dep", max=cap)
        except TypeError as exc:
            raise Unavailable(f"registry.limit('dep', max={cap!r}) raised TypeError: {exc}") from None
        limits = ["dep"]

    async def attempt(ctx: trioq.JobContext, i: int, at: float, key: int, uses: bool) -> None:
        recorder.attempts += 1
        try:
            if uses:
                await dependency.call(key, ctx.attempt)
            else:
                await local_work(key, ctx.attempt)
        except trioq.Overloaded:
            recorder.failed_attempts += 1
            raise
        recorder.finished[i] = trio.current_time() - dependency.t0

    async def dep(ctx: trioq.JobContext, i: int, at: float, key: int) -> None:
        await attempt(ctx, i, at, key, True)

    async def local(ctx: trioq.JobContext, i: int, at: float, key: int) -> None:
        await attempt(ctx, i, at, key, False)

    registry.task(name="dep", max_attempts=MAX_ATTEMPTS, backoff=BACKOFF, limits=limits)(dep)
    registry.task(name="local", max_attempts=MAX_ATTEMPTS, backoff=BACKOFF)(local)
    return registry


def open_arm(registry: trioq.Registry, arm: Arm, store: trioq.Store, *, precise: bool) -> Any:
    """``trioq.open_queue`` for ``arm`` (not yet entered); :class:`Unavailable` if it refuses an option."""
    options: dict[str, Any] = {
        "store": store,
        "workers": arm.workers,
        "shutdown_grace": 0.0,
        "max_ready": arm.max_ready,
        "fairness": arm.fairness,
        "precise_timers": precise,
    }
    if arm.overflow is not None:
        options["overflow"] = arm.overflow
    try:
        return trioq.open_queue(registry, **options)
    except TypeError as exc:
        raise Unavailable(f"open_queue(overflow={arm.overflow!r}) raised TypeError: {exc}") from None


async def run_arm(
    profile: Profile, arm: Arm, trace: Trace, store: trioq.Store, *, real: bool = False
) -> dict[str, Any]:
    """Feed ``trace`` to a queue configured as ``arm``; the run's figures (see :func:`figures`).

    The feeder enqueues each task at its arrival (``sleep_until`` from the start); after the
    last arrival the queue may drain for :data:`DRAIN` seconds; then every job's state is read,
    and the queue is closed with no grace (running attempts are cancelled; they count as
    unfinished).
    """
    recorder = Recorder(len(trace.tasks))
    dependency = Dependency(profile, 0.0)
    registry = build_registry(arm, dependency, recorder)
    context = open_arm(registry, arm, store, precise=real)
    ids: dict[int, str] = {}
    refused: set[int] = set()
    caps: list[tuple[float, int]] = []  # (seconds from the start, the adaptive cap then)
    wall0 = time.perf_counter()
    async with context as queue:
        t0 = dependency.t0 = trio.current_time()

        async def sample_caps(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            while True:
                stats = await queue.stats()
                cap = stats["limits"].get("dep", {}).get("cap")
                if cap is not None:
                    caps.append((trio.current_time() - t0, cap))
                await trio.sleep(CAP_SAMPLE)

        async with trio.open_nursery() as nursery:
            if arm.limit == "adaptive":
                await nursery.start(sample_caps)
            for task in trace.tasks:
                await trio.sleep_until(t0 + task.at)
                name = "dep" if task.uses_dependency else "local"
                payload = {"i": task.index, "at": task.at, "key": task.key}
                try:
                    job = await queue.enqueue(name, payload, tenant=task.tenant, deadline=arm.deadline)
                except trioq.QueueFull:
                    refused.add(task.index)
                else:
                    ids[task.index] = job.id
            with trio.move_on_at(t0 + profile.duration + DRAIN):
                await queue.join()
            nursery.cancel_scope.cancel()
        states = {i: str((await queue.get(job_id)).state) for i, job_id in ids.items()}
        virtual_s = trio.current_time() - t0
    return figures(profile, arm, trace, recorder, dependency, refused, states, caps) | {
        "clock": "real" if real else "virtual",
        "run_s": r3(virtual_s),
        "wall_s": r3(time.perf_counter() - wall0),
    }


def figures(
    profile: Profile,
    arm: Arm,
    trace: Trace,
    recorder: Recorder,
    dependency: Dependency,
    refused: set[int],
    states: dict[int, str],
    caps: list[tuple[float, int]],
) -> dict[str, Any]:
    """One run's line: outcome counts (which sum to ``offered``), on-time %, failed attempt %, latency of the
    completed (p50/p99, ms), per-tenant on-time %, downstream calls above capacity, adaptive caps seen."""
    totals, tenants, latencies = classify(trace, refused, states, recorder.finished)
    offered = len(trace.tasks)
    line: dict[str, Any] = {
        "offered": offered,
        **totals,
        "accounted": sum(totals.values()),
        "on_time_pct": r3(pct(totals["on_time"], offered)),
        "attempts": recorder.attempts,
        "failed_attempts": recorder.failed_attempts,
        "failed_attempt_pct": r3(pct(recorder.failed_attempts, recorder.attempts)),
        "p50_ms": r3(1000 * percentile(latencies, 50)) if latencies else None,
        "p99_ms": r3(1000 * percentile(latencies, 99)) if latencies else None,
        "dependency_calls": dependency.calls,
        "above_capacity": dependency.above,
        "max_in_flight": dependency.max_in_flight,
    }
    if len(tenants) > 1:
        line["tenant_on_time_pct"] = {
            name: r3(pct(counts["on_time"], sum(counts.values()))) for name, counts in sorted(tenants.items())
        }
    if arm.limit == "adaptive":
        values = [cap for _, cap in caps]
        line["cap_samples"] = {"n": len(values), "min": min(values, default=None), "max": max(values, default=None)}
        line["cap_median"] = spread(values)["median"]
        # The median cap in each span of constant capacity (arrivals only: not the drain).
        bounds = [t for t, _ in profile.capacity] + [profile.duration]
        line["cap_median_by_capacity"] = [
            {"from_s": a, "to_s": b, "capacity": profile.capacity_at(a)}
            | {"cap_median": spread([cap for t, cap in caps if a <= t < b])["median"]}
            for a, b in itertools.pairwise(bounds)
        ]
        if values and min(values) == max(values) == 1:
            line["note"] = "the adaptive cap never left min=1: its controller does not seem wired to the runtime"
    return line


@contextlib.contextmanager
def quiet_trioq() -> Iterator[None]:
    """Silence the ``trioq`` logger inside (every failed attempt logs a traceback: thousands a run)."""
    logger_ = logging.getLogger("trioq")
    level = logger_.level
    logger_.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger_.setLevel(level)


def seed_trio(seed: int) -> None:
    """Seed trio's scheduler RNG (it reverses runnable batches at random), so a run repeats itself."""
    scheduler = getattr(getattr(trio, "_core", None), "_run", None)
    rng = getattr(scheduler, "_r", None)
    if rng is not None:
        rng.seed(seed)


def run_virtual(profile: Profile, arm: Arm, trace: Trace) -> dict[str, Any]:
    """:func:`run_arm` on a MemoryStore in virtual time (``MockClock(autojump_threshold=0)``)."""
    seed_trio(trace.seed)
    clock = trio.testing.MockClock(autojump_threshold=0)
    with quiet_trioq():
        result: dict[str, Any] = trio.run(run_arm, profile, arm, trace, trioq.MemoryStore(), clock=clock)
    return result


def run_real(profile: Profile, arm: Arm, trace: Trace) -> dict[str, Any]:
    """:func:`run_arm` on a fresh WALStore (default ``fsync="always"``) in real time."""
    with tempfile.TemporaryDirectory(prefix="trioq-overload-") as directory:

        async def main() -> dict[str, Any]:
            return await run_arm(profile, arm, trace, trioq.WALStore(directory), real=True)

        with quiet_trioq():
            result: dict[str, Any] = trio.run(main)
        return result


def run_profile(
    number: int, seeds: Sequence[int], *, scale: float = 1.0, trace_dir: Path | None = TRACE_DIR
) -> list[dict[str, Any]]:
    """Every arm of profile ``number`` over the traces of ``seeds``: its ``overload_run`` lines, then its
    ``overload`` (summary) lines, then its ``overload_target`` line. Traces are made first (and written
    to ``trace_dir`` unless it is ``None``); an arm the tree cannot run gets one line with ``unavailable``.
    """
    profile = PROFILES[number].scaled(scale)
    traces = [make_trace(profile, seed, scale) for seed in seeds]
    if trace_dir is not None:
        for trace in traces:
            save_trace(trace, trace_dir)
    head = {"profile": number, "profile_name": profile.name}
    lines: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {}
    unavailable: dict[str, str] = {}
    for arm in profile.arms:
        for trace in traces:
            try:
                result = run_virtual(profile, arm, trace)
            except Unavailable as exc:
                unavailable[arm.name] = str(exc)
                log(f"profile {number} {arm.name}: unavailable ({exc})")
                break
            line = {"section": "overload_run", **head, "arm": arm.name, "seed": trace.seed}
            line |= {"trace_sha256": trace.sha256, "store": "memory", **result}
            lines.append(line)
            runs.setdefault(arm.name, []).append(line)
            log(
                f"profile {number} {arm.name} seed {trace.seed}: {line['on_time_pct']}% on time,"
                f" {line['failed_attempt_pct']}% failed attempts, {line['above_capacity']} above capacity"
                f" ({line['wall_s']} s)"
            )
    summaries = {}
    for arm in profile.arms:
        if arm.name in unavailable:
            summary: dict[str, Any] = {"section": "overload", **head, "arm": arm.name}
            summary["unavailable"] = unavailable[arm.name]
        else:
            summary = summarize(head, arm, runs[arm.name], traces)
        summaries[arm.name] = summary
        lines.append(summary)
    lines.append(judge(profile, summaries, runs) | head)
    return lines


def real_versus_virtual(trace_dir: Path | None, number: int = REAL_PROFILE) -> list[dict[str, Any]]:
    """Profile ``number``, seed :data:`REAL_SEED`, :data:`REAL_SCALE` of its length: each arm in real time on
    a WALStore beside the same trace in virtual time; ``overload_real`` lines with both on-time figures
    and their difference (real minus virtual, in points)."""
    profile = PROFILES[number].scaled(REAL_SCALE)
    trace = make_trace(profile, REAL_SEED, REAL_SCALE)
    if trace_dir is not None:
        save_trace(trace, trace_dir)
    lines = []
    for arm in profile.arms:
        virtual = run_virtual(profile, arm, trace)
        real = run_real(profile, arm, trace)
        diff = real["on_time_pct"] - virtual["on_time_pct"]
        line = {"section": "overload_real", "profile": number, "arm": arm.name, "seed": REAL_SEED}
        line |= {"scale": REAL_SCALE, "trace_sha256": trace.sha256, "store": "wal", "fsync": "always"}
        line |= {"virtual_on_time_pct": virtual["on_time_pct"], "real_on_time_pct": real["on_time_pct"]}
        line |= {"difference_points": r3(diff), "within_3_points": abs(diff) <= 3.0}
        line |= {"virtual": virtual, "real": real}
        log(f"real vs virtual, profile {number} {arm.name}: {real['on_time_pct']} vs {virtual['on_time_pct']}")
        lines.append(line)
    return lines


def tree_state() -> dict[str, Any]:
    """The commit benchmarked and the files of ``trioq/`` changed on top of it (others edit it as this runs)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--short", "trioq"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return {}
    return {"git_head": head.stdout.strip(), "trioq_changed_files": dirty.stdout.split("\n")[:-1]}


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--profiles", default=",".join(str(n) for n in PROFILES), help="e.g. 1,2,5")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per profile (1..N)")
    parser.add_argument("--smoke", action="store_true", help="1 seed, quarter-length traces, virtual time only")
    parser.add_argument("--real", action="store_true", help="also run one profile in real time on a WALStore")
    parser.add_argument("--real-profile", type=int, default=REAL_PROFILE, help="the profile --real runs (4)")
    parser.add_argument("--trace-dir", type=Path, default=TRACE_DIR, help="where traces are written")
    parser.add_argument("--table", type=Path, help="print the docs' markdown tables from this results file, and stop")
    args = parser.parse_args(argv)
    if args.table is not None:
        print(markdown([json.loads(raw) for raw in args.table.read_text().splitlines() if raw.strip()]))
        return
    numbers = [int(p) for p in args.profiles.split(",") if p]
    seeds = [1] if args.smoke else list(range(1, args.seeds + 1))
    scale = SMOKE_SCALE if args.smoke else 1.0
    emit(
        env_line(
            args.smoke,
            benchmark="overload",
            profiles=numbers,
            seeds=seeds,
            scale=scale,
            slo_ms=SLO * 1000,
            l0_ms=L0 * 1000,
            workers=WORKERS,
            drain_s=DRAIN,
            max_attempts=MAX_ATTEMPTS,
            clock="trio.testing.MockClock(autojump_threshold=0)",
            store="MemoryStore",
            **tree_state(),
        )
    )
    started = time.perf_counter()
    for number in numbers:
        profile_line = {"section": "overload_profile", **describe(PROFILES[number].scaled(scale)), "scale": scale}
        emit(profile_line)
        for line in run_profile(number, seeds, scale=scale, trace_dir=args.trace_dir):
            emit(line)
    if args.real and not args.smoke:
        for line in real_versus_virtual(args.trace_dir, args.real_profile):
            emit(line)
    log(f"done in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
