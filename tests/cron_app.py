"""A registry with cron schedules, importable as ``tests.cron_app:registry`` (for ``trioq cron list --app``)."""

from __future__ import annotations

import trioq

registry = trioq.Registry()


@registry.task
async def noop(ctx: trioq.JobContext) -> None:
    """Does nothing: the schedules below enqueue it."""


registry.cron("*/5 * * * *", "noop", name="every5")
registry.cron("0 9 * * *", "noop", name="morning", tz="America/Sao_Paulo")
