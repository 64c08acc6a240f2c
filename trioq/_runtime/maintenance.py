"""Maintenance: scheduled jobs made ready on time, expired leases rescued, old jobs evicted.

The timer sleeps until the earliest ``run_at`` it heard of (the store's
``on_scheduled`` hint, and what :meth:`Store.promote` says is next), then
promotes. It also wakes every ``poll_interval``: a job scheduled by another
node is heard of by no hint. Rescue (jobs of nodes whose lease lapsed) runs
every ``poll_interval`` too (every quarter of the lease, if that is sooner:
a dead node's jobs run again within its lease and a quarter); eviction of terminal jobs past retention every
quarter of the retention (between 50 ms and 30 s). A store shared by many
nodes says which one leads (its ``leading()``): rescue and eviction run on
that node alone; an in-process store, whose only node is this one, always
leads.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import trio

from ..stores._base import Store
from .logs import emit

__all__ = ["Maintenance"]

# Scheduled jobs are promoted this long after their run_at: wall-clock run_at
# converted to trio time and back can round a hair early, and promoting a job
# "almost due" would spin the timer under an autojump clock.
_TIMER_SLACK = 1e-5


def _always() -> bool:
    return True


class Maintenance:
    """See the module docstring. ``offset`` turns the store's wall clock into trio time
    (``wall - offset``)."""

    def __init__(
        self, store: Store, *, offset: float, retention: float, poll_interval: float, lease: float = math.inf
    ) -> None:
        self._store = store
        self._rescue_every = min(poll_interval, lease / 4)
        self._offset = offset
        self._retention = retention
        self._poll_interval = poll_interval
        self._timer_at = math.inf
        self._timer_scope: trio.CancelScope | None = None
        leading = getattr(store, "leading", None)
        self._leading: Callable[[], bool] = leading if callable(leading) else _always

    def scheduled(self, run_at: float) -> None:
        """The store's hint: a job was scheduled for wall-clock ``run_at``."""
        at = run_at - self._offset + _TIMER_SLACK
        if at < self._timer_at:
            self._timer_at = at
            if self._timer_scope is not None:
                self._timer_scope.deadline = min(self._timer_scope.deadline, at)

    async def run(self) -> None:
        """Run the timer, rescue and eviction until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._timer)
            nursery.start_soon(self._evict)
            if self._rescue_every != math.inf:
                nursery.start_soon(self._rescue)

    async def _timer(self) -> None:
        while True:
            self._timer_at = math.inf
            next_run_at = await self._store.promote()
            if next_run_at is not None:
                self._timer_at = min(self._timer_at, next_run_at - self._offset + _TIMER_SLACK)
            deadline = min(self._timer_at, trio.current_time() + self._poll_interval)
            with trio.CancelScope(deadline=deadline) as self._timer_scope:
                await trio.sleep_forever()
            self._timer_scope = None

    async def _evict(self) -> None:
        every = min(max(self._retention / 4, 0.05), 30.0)
        while True:
            await trio.sleep(every)
            if self._leading():
                await self._store.evict()

    async def _rescue(self) -> None:
        while True:
            await trio.sleep(self._rescue_every)
            if not self._leading():
                continue
            rescued = await self._store.rescue()
            if rescued:
                message = "rescued %d running job(s) of nodes whose lease lapsed"
                emit(logging.WARNING, message, rescued, extra={"rescued": rescued})
