"""Built-in tasks for demos, load generation and experiments: ``sim`` and ``cpu``."""

from __future__ import annotations

import hashlib
import random
import time
from typing import Any

import trio

from .._context import JobContext
from .._registry import Registry
from .._runtime.runners import ProcessJobContext

__all__ = ["builtin_registry", "cpu", "sim"]

#: ``sim`` sleeps in slices of this many seconds, heartbeating between them.
SIM_SLICE = 0.010


def _draw(ctx: JobContext, salt: str) -> float:
    """A uniform draw that depends only on the job and its attempt (replays the same)."""
    return random.Random(f"{ctx.job.id}:{ctx.attempt}:{salt}").random()


async def sim(ctx: JobContext, work_ms: float = 10.0, fail_prob: float = 0.0, hang_prob: float = 0.0) -> dict[str, Any]:
    """Simulated work: ``work_ms`` of sleeping in 10 ms slices with heartbeats.

    Then, with probability ``hang_prob``, hangs forever without heartbeats (the
    health machinery must catch it), or with ``fail_prob`` raises. The draws
    are seeded by the job id and attempt number, so a run replays exactly.
    """
    for name, value in (("work_ms", work_ms), ("fail_prob", fail_prob), ("hang_prob", hang_prob)):
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    remaining = work_ms / 1000.0
    while remaining > 0:
        step = min(SIM_SLICE, remaining)
        await trio.sleep(step)
        remaining -= step
        ctx.heartbeat()
    if _draw(ctx, "hang") < hang_prob:
        await trio.sleep_forever()
    if _draw(ctx, "fail") < fail_prob:
        raise RuntimeError(f"simulated failure (fail_prob={fail_prob})")
    return {"work_ms": work_ms, "attempt": ctx.attempt}


def cpu(ctx: ProcessJobContext, rounds: int = 100_000) -> str:
    """Chained SHA-256 ``rounds`` times in a worker process, heartbeating every 50 ms."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be an int >= 0, got {rounds!r}")
    digest = b"trioq"
    next_beat = time.monotonic() + 0.05
    for i in range(rounds):
        digest = hashlib.sha256(digest).digest()
        if i % 1024 == 0 and time.monotonic() >= next_beat:
            ctx.heartbeat()
            next_beat = time.monotonic() + 0.05
    return digest.hex()


def builtin_registry() -> Registry:
    """A fresh registry holding ``sim`` (async) and ``cpu`` (process)."""
    registry = Registry()
    registry.add(sim, max_attempts=5)
    registry.add(cpu, kind="process", max_attempts=3)
    return registry
