"""A registry for ``trioq serve --app`` whose handler exits the way a CLI script does."""

from __future__ import annotations

import sys

import trioq

registry = trioq.Registry()


@registry.task(max_attempts=2, backoff=trioq.Backoff(base=0.0, jitter=0.0))
async def quits(ctx: trioq.JobContext) -> None:
    sys.exit(0)
