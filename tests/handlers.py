"""Module-level handlers for process-kind tests (process handlers are pickled by name)."""

from __future__ import annotations

import hashlib
import time
from typing import Any


def square(ctx: Any, n: int) -> int:
    return n * n


def spin(ctx: Any, seconds: float) -> str:
    """Burn CPU for ``seconds`` without heartbeating."""
    end = time.monotonic() + seconds
    digest = b""
    while time.monotonic() < end:
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


def spin_beating(ctx: Any, seconds: float) -> str:
    """Burn CPU for ``seconds``, heartbeating every 20 ms."""
    end = time.monotonic() + seconds
    next_beat = 0.0
    digest = b""
    while (now := time.monotonic()) < end:
        if now >= next_beat:
            ctx.heartbeat()
            next_beat = now + 0.02
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


def explode(ctx: Any) -> None:
    raise ValueError("boom in a process")


def touch(ctx: Any, path: str) -> None:
    """Leave a mark that the handler ran."""
    with open(path, "w") as f:
        f.write("ran")


def exit_zero(ctx: Any) -> None:
    """A handler that ends its process the way a script would."""
    import sys

    sys.exit(0)


def interrupt(ctx: Any) -> None:
    raise KeyboardInterrupt


def no_retry_in_a_process(ctx: Any) -> None:
    """Give up for good from a worker process (``trioq.NoRetry`` comes back pickled)."""
    import trioq

    raise trioq.NoRetry("from a process")


def snooze_in_a_process(ctx: Any) -> str:
    """Snooze the first claim, succeed at the second (``trioq.Snooze`` comes back pickled)."""
    import trioq

    if ctx.job.epoch == 1:
        raise trioq.Snooze(0.01)
    return "ok"


def pid_then_sleep(ctx: Any, path: str, seconds: float) -> None:
    """Write this worker process's pid to ``path``, then sleep (no heartbeat)."""
    import os

    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
