"""The soak's tasks: ``trioq worker --app benchmarks.soak.app:registry`` (or ``trioq serve --app ...``).

Every attempt journals itself to a side file the store never sees: the
directory ``SOAK_JOURNAL`` names gets one file per process (``<pid>.jsonl``),
a JSON line per event, each written with one ``write`` to an ``O_APPEND``
descriptor and fsynced before the handler goes on. A ``start`` line is written
when the handler is entered (its limit keys already held) and an ``end`` line
(``outcome`` ``ok``, ``error`` or ``cancelled``) as it leaves, so the verdict
(``verdict.py``) sees every execution, including the ones a SIGKILL cut off
(a ``start`` without an ``end``). Without ``SOAK_JOURNAL`` nothing is written.

The mix (``MIX`` holds what ``run.py`` enqueues, with its weights):

- ``soak.plain``: sleeps a few ms; ``soak.flaky``: fails its first attempts,
  then succeeds; ``soak.doomed``: always fails (dead after 2 attempts);
- ``soak.part`` x N then ``soak.gather`` (``after=`` them): the fan-in child
  checks ``ctx.parents`` against the results it expects;
- ``soak.slow``: runs longer than the chaos interval, heartbeating;
- ``soak.mutex`` (key ``mutex``, max 1), ``soak.capped`` (``cap3``, max 3),
  ``soak.rated`` (``rate10``: 10/s, burst 2), ``soak.both`` (``both``: max 2,
  5/s, burst 1);
- ``soak.tick``: the cron schedule ``TICK_SCHEDULE`` (every 10 s).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

import trioq

__all__ = ["CRON_PERIOD", "CRON_TASK", "LIMITS", "TASK_LIMITS", "registry"]

JOURNAL_ENV = "SOAK_JOURNAL"
CRON_TASK = "soak.tick"
TICK_SCHEDULE = "* * * * * */10"
CRON_PERIOD = 10.0

#: key -> its limit, as declared below (the verdict checks each against the journal).
LIMITS: dict[str, dict[str, Any]] = {
    "mutex": {"max": 1, "rate": None, "per": 1.0, "burst": 1},
    "cap3": {"max": 3, "rate": None, "per": 1.0, "burst": 1},
    "rate10": {"max": None, "rate": 10.0, "per": 1.0, "burst": 2},
    "both": {"max": 2, "rate": 5.0, "per": 1.0, "burst": 1},
}
TASK_LIMITS: dict[str, list[str]] = {
    "soak.mutex": ["mutex"],
    "soak.capped": ["cap3"],
    "soak.rated": ["rate10"],
    "soak.both": ["both"],
}

registry = trioq.Registry()
for _key, _limit in LIMITS.items():
    _rated = {"rate": _limit["rate"], "per": _limit["per"], "burst": _limit["burst"]} if _limit["rate"] else {}
    registry.limit(_key, max=_limit["max"], **_rated)

_fd: int | None = None
_fd_pid: int | None = None


async def _write(line: dict[str, Any]) -> None:
    """Append ``line`` to this process's journal file: written at once (a SIGKILL cannot lose it), then
    fsynced in a thread, shielded. An fsync on the trio thread stalled the worker's every task for as
    long as the disk took (0.18 s seen): jobs claimed meanwhile started late, and a rate key's starts
    looked closer together than its claims were."""
    global _fd, _fd_pid
    directory = os.environ.get(JOURNAL_ENV)
    if directory is None:
        return
    if _fd is None or _fd_pid != os.getpid():
        _fd = os.open(os.path.join(directory, f"{os.getpid()}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_pid = os.getpid()
    os.write(_fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(os.fsync, _fd)


def _line(ctx: trioq.JobContext, event: str, **extra: Any) -> dict[str, Any]:
    job = ctx.job
    line = {"ev": event, "job": job.id, "task": job.task, "attempt": ctx.attempt, "epoch": job.epoch}
    line.update(pid=os.getpid(), t=time.time(), **extra)
    if job.task == CRON_TASK:
        line["key"] = job.key
    return line


async def _journaled(ctx: trioq.JobContext, body: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``body`` between a ``start`` and an ``end`` line; ``end`` says how it left."""
    await _write(_line(ctx, "start"))
    try:
        result = await body()
    except trio.Cancelled:
        await _write(_line(ctx, "end", outcome="cancelled"))
        raise
    except Exception:
        await _write(_line(ctx, "end", outcome="error"))
        raise
    extra = result.pop("_journal", {}) if isinstance(result, dict) else {}
    await _write(_line(ctx, "end", outcome="ok", **extra))
    return result


_QUICK = trioq.Backoff(base=0.05, factor=2.0, max=1.0, jitter=0.5)


@registry.task(name="soak.plain", max_attempts=3, backoff=_QUICK)
async def plain(ctx: trioq.JobContext, n: int, ms: int = 5) -> int:
    """Sleep ``ms`` milliseconds; return ``n``."""

    async def body() -> int:
        await trio.sleep(ms / 1000)
        return n

    return int(await _journaled(ctx, body))


@registry.task(name="soak.flaky", max_attempts=4, backoff=_QUICK)
async def flaky(ctx: trioq.JobContext, n: int, fails: int = 1) -> int:
    """Fail attempts ``1..fails`` (``RuntimeError``), then return ``n``."""

    async def body() -> int:
        await trio.sleep(0.005)
        if ctx.attempt <= fails:
            raise RuntimeError(f"flaky job {n}: attempt {ctx.attempt} of the first {fails} fails")
        return n

    return int(await _journaled(ctx, body))


@registry.task(name="soak.doomed", max_attempts=2, backoff=_QUICK)
async def doomed(ctx: trioq.JobContext, n: int) -> None:
    """Always fail: the job ends dead after 2 attempts."""

    async def body() -> None:
        raise RuntimeError(f"doomed job {n} fails every attempt")

    await _journaled(ctx, body)


@registry.task(name="soak.part", max_attempts=3, backoff=_QUICK)
async def part(ctx: trioq.JobContext, flow: int, i: int) -> int:
    """A fan-in parent: return ``flow * 100 + i``."""

    async def body() -> int:
        await trio.sleep(0.005)
        return flow * 100 + i

    return int(await _journaled(ctx, body))


@registry.task(name="soak.gather", max_attempts=3, backoff=_QUICK)
async def gather(ctx: trioq.JobContext, flow: int, parts: int) -> dict[str, Any]:
    """The fan-in child: its parents' results must be exactly ``flow * 100 + i`` for ``i < parts``."""

    async def body() -> dict[str, Any]:
        seen = sorted(ctx.parents.values())
        ok = seen == [flow * 100 + i for i in range(parts)] and len(ctx.parents) == parts
        return {"sum": sum(seen), "_journal": {"parents_ok": ok}}

    result: dict[str, Any] = await _journaled(ctx, body)
    return result


@registry.task(name="soak.slow", max_attempts=3, backoff=_QUICK, heartbeat_timeout=10.0)
async def slow(ctx: trioq.JobContext, n: int, seconds: float = 20.0) -> int:
    """Run ``seconds`` (longer than the chaos interval), heartbeating every 0.5 s."""

    async def body() -> int:
        deadline = trio.current_time() + seconds
        while trio.current_time() < deadline:
            ctx.heartbeat()
            await trio.sleep(0.5)
        return n

    return int(await _journaled(ctx, body))


def _limited(name: str, key: str) -> None:
    @registry.task(name=name, max_attempts=3, backoff=_QUICK, limits=[key])
    async def handler(ctx: trioq.JobContext, n: int, ms: int = 20) -> int:
        async def body() -> int:
            await trio.sleep(ms / 1000)
            return n

        return int(await _journaled(ctx, body))

    handler.__doc__ = f"Hold ``{key}`` for ``ms`` milliseconds; return ``n``."


for _task, _keys in TASK_LIMITS.items():
    _limited(_task, _keys[0])


@registry.task(name=CRON_TASK, max_attempts=1)
async def tick(ctx: trioq.JobContext) -> None:
    """A cron tick: journaled with its key, so the verdict sees each tick run once."""

    async def body() -> None:
        await trio.sleep(0.001)

    await _journaled(ctx, body)


registry.cron(TICK_SCHEDULE, CRON_TASK, name="soak-tick")
