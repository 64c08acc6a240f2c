"""A node's worker pools: one for every queue, or one per named queue (``workers={"email": 4, ...}``).

:class:`Pools` stands in front of the :class:`~.pool.WorkerPool` s as one
pool does: the store's hints reach every pool (a hint does not say which queue
it is about; a pool that finds nothing parks again), shutdown stops them all,
and :meth:`Pools.stats` sums them, so ``stats()["workers"]`` keeps its shape
whatever the split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from .. import _validate as validate
from .._model import Job
from .executor import Executor
from .pool import WorkerPool

__all__ = ["Pools", "worker_split"]


def worker_split(workers: object) -> dict[str | None, int]:
    """``open_queue``'s ``workers`` as ``{queue name or None (every queue): size}``.

    An int is one pool serving every queue (0: producer-only). A mapping gives
    each named queue its own pool of at least one worker. Raises
    ``ValueError`` or ``TypeError`` naming what is wrong.
    """
    if isinstance(workers, Mapping):
        if not workers:
            raise ValueError("workers must name at least one queue, e.g. {'default': 8}, or be an int")
        split: dict[str | None, int] = {}
        for name, size in workers.items():
            label = validate.label("workers key", name, error=ValueError)
            split[label] = validate.integer(f"workers[{label!r}]", size, minimum=1, error=ValueError)
        return split
    if not isinstance(workers, int):  # a bool is an int, and refused as a count: ValueError
        raise TypeError(f"workers must be an int or a mapping of queue name to int, got {type(workers).__name__}")
    return {None: validate.integer("workers", workers, minimum=0, error=ValueError)}


class Pools:
    """The node's pools, driven as one (see the module docstring)."""

    def __init__(self, split: Mapping[str | None, int], **options: Any) -> None:
        self.pools = [
            WorkerPool(size=size, queues=None if name is None else (name,), **options) for name, size in split.items()
        ]
        #: Called as ``observer(task, queue_wait_s, run_s)`` after each attempt, in every pool.
        self.observers: list[Callable[[str, float, float], None]] = []
        for pool in self.pools:
            pool.observers = self.observers

    @property
    def executors(self) -> list[Executor]:
        return [pool.executor for pool in self.pools]

    @property
    def healthy(self) -> int:
        return sum(pool.healthy for pool in self.pools)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run every pool until :meth:`cancel`; started once all have started."""
        async with trio.open_nursery() as nursery:
            for pool in self.pools:
                await nursery.start(pool.run)
            task_status.started()

    def wake(self, n: int) -> None:
        """The store's hint that ``n`` jobs may have become claimable, for every pool."""
        for pool in self.pools:
            pool.wake(n)

    def takers(self) -> dict[str | None, int]:
        """``StoreConfig.takers``: how many claimed jobs each pool's parked workers would take at once, by the
        queue it serves (``None``: every queue); pools with none left out."""
        out: dict[str | None, int] = {}
        for pool in self.pools:
            n = pool.producer.takers()
            if n:
                out[None if pool.queues is None else pool.queues[0]] = n
        return out

    def hand_over(self, jobs: Sequence[Job]) -> None:
        """``StoreConfig.on_claimed``: each job to the pool serving its queue (the one that serves every queue,
        else its named queue's)."""
        for pool in self.pools:
            mine = [job for job in jobs if pool.queues is None or job.queue in pool.queues]
            if mine:
                pool.producer.hand_over(mine)

    def cancel_attempt(self, job_id: str, epoch: int) -> None:
        """The store's ``on_cancel`` hint: the pool running that attempt stops it."""
        for pool in self.pools:
            pool.cancel_attempt(job_id, epoch)

    def stop_claiming(self) -> None:
        for pool in self.pools:
            pool.stop_claiming()

    async def wait_drained(self) -> None:
        for pool in self.pools:
            await pool.wait_drained()

    def cancel(self) -> None:
        for pool in self.pools:
            pool.cancel()

    def stats(self) -> dict[str, int]:
        """Every pool's figures, summed (``stats()["workers"]``)."""
        total: dict[str, int] = {}
        for pool in self.pools:
            for name, value in pool.stats().items():
                total[name] = total.get(name, 0) + value
        return total

    def idle_for(self, queue: str) -> int | None:
        """Idle workers of the pool that serves ``queue`` (``None``: no pool of this node serves it)."""
        for pool in self.pools:
            if pool.size and (pool.queues is None or queue in pool.queues):
                return pool.stats()["idle"]
        return None

    def sizes(self) -> dict[str, int]:
        """Workers per named queue (``"*"``: the pool that serves every queue)."""
        return {"*" if pool.queues is None else pool.queues[0]: pool.size for pool in self.pools}
