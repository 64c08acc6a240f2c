"""A small registry shared by the HTTP tests."""

from __future__ import annotations

import trio

import trioq


def make_registry() -> trioq.Registry:
    """``echo`` returns its text, ``boom`` always fails (one attempt), ``slow`` runs ~forever;
    limit key ``shared`` (a generous max) and the pattern ``user:*`` are declared."""
    registry = trioq.Registry()
    registry.limit("shared", max=1000)
    registry.limit("user:*", max=1000)

    @registry.task(max_attempts=1)
    async def echo(ctx: trioq.JobContext, text: str = "") -> str:
        return text

    @registry.task(max_attempts=1)
    async def boom(ctx: trioq.JobContext) -> None:
        raise RuntimeError("no")

    @registry.task
    async def slow(ctx: trioq.JobContext) -> None:
        await trio.sleep(1000)

    return registry
