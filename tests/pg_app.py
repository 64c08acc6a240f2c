"""Tasks for the PostgreSQL process tests: each attempt journals itself to a file the store never sees.

``TRIOQ_TEST_JOURNAL`` names a directory; every worker process appends JSON lines
``{"job", "epoch", "pid", "event", "at"}`` to a file of its own there (``start``, then
``end`` or ``cancelled``), so a test can count executions and see who ran what, when.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import trio

import trioq

registry = trioq.Registry()


def _journal(ctx: trioq.JobContext, event: str) -> None:
    directory = os.environ.get("TRIOQ_TEST_JOURNAL")
    if directory is None:
        return
    line = {"job": ctx.job.id, "epoch": ctx.job.epoch, "pid": os.getpid(), "event": event, "at": time.time()}
    with open(Path(directory) / f"{os.getpid()}.jsonl", "a") as file:
        file.write(json.dumps(line) + "\n")
        file.flush()
        os.fsync(file.fileno())


@registry.task(max_attempts=1)
async def step(ctx: trioq.JobContext, seconds: float = 0.0, n: int = 0) -> int:
    """Sleep ``seconds``, journaled; returns ``n``."""
    _journal(ctx, "start")
    try:
        await trio.sleep(seconds)
    except trio.Cancelled:
        _journal(ctx, "cancelled")
        raise
    _journal(ctx, "end")
    return n


#: A slot key the process tests share: two attempts at most across every node.
registry.limit("pool", max=2)


@registry.task(max_attempts=1, limits=["pool"])
async def limited(ctx: trioq.JobContext, seconds: float = 0.0, n: int = 0) -> int:
    """``step`` holding the ``pool`` key."""
    return await step(ctx, seconds, n)


def read_journal(directory: Path) -> list[dict[str, Any]]:
    """Every line every process journaled, in time order."""
    lines = []
    for path in directory.glob("*.jsonl"):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(lines, key=lambda line: line["at"])
