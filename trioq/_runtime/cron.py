"""The cron scheduler: each schedule's ticks enqueued once per store, by the node that leads it.

:class:`CronScheduler` runs in the queue's nursery. It sleeps on the trio
clock until the next tick of any schedule (wall time, converted with the
queue's ``offset``), then, while this node leads the store (``store.leading()``
where the store has it; an in-process store's only node always leads), calls
:meth:`Store.add_tick` with each due schedule's latest tick at or before now.
The store decides: a tick some node (or an earlier leader) took already
enqueues nothing. After downtime only the latest missed tick is due, so it
runs once, however many were missed.

The first time a store sees a schedule (no mark under its name), the
scheduler records a baseline (``add_tick(name, now, None)``): no tick before
that session runs, and the next tick is the first. A node that does not lead
looks every ``poll_interval``, so that a new leader takes a due tick within
one poll. A store call that fails (the store out of reach) is logged at
``ERROR`` and tried again after a pause that doubles from 1 s to 60 s; the
queue goes on.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable
from typing import Any

import trio

from .._model import JobSpec, error_text
from .._registry import CronSpec, Registry, tick_key
from ..stores._base import NewJob, Store
from .logs import emit

__all__ = ["CronScheduler"]

#: Seconds past a tick the scheduler wakes (wall time converted to trio time and back may round a
#: hair early, and waking "almost at" a tick would spin under an autojump clock).
_SLACK = 1e-5
#: The pauses after a failing store call: the first, and the most.
_RETRY_FIRST, _RETRY_MAX = 1.0, 60.0


def _always() -> bool:
    return True


class CronScheduler:
    """See the module docstring. ``clock`` returns wall time; ``offset`` turns it into trio time
    (``wall - offset``); ``resolve(spec, now)`` makes the :class:`NewJob` of a :class:`JobSpec` with
    the task's defaults, as an enqueue would."""

    def __init__(
        self,
        registry: Registry,
        store: Store,
        *,
        clock: Callable[[], float],
        offset: float,
        poll_interval: float,
        resolve: Callable[[JobSpec, float], NewJob],
    ) -> None:
        registry.check_crons()
        self._specs = registry.crons
        self._store = store
        self._clock = clock
        self._offset = offset
        self._poll_interval = poll_interval
        self._resolve = resolve
        leading = getattr(store, "leading", None)
        self._leading: Callable[[], bool] = leading if callable(leading) else _always
        #: The store's marks as this node last knew them (``None``: to be read).
        self._marks: dict[str, float] | None = None
        #: Jobs this node enqueued for ticks, per schedule, since the queue opened.
        self.enqueued: dict[str, int] = dict.fromkeys((spec.name for spec in self._specs), 0)

    async def stats(self) -> list[dict[str, Any]]:
        """``stats()["cron"]``: each schedule (by name) with ``name``, ``schedule``, ``task``, ``tz``,
        ``next_run`` (wall time of the tick it enqueues next: a tick missed and not yet taken is
        due now, so it is that tick) and ``last_tick`` (the store's mark, ``None`` before any), and
        ``enqueued`` (jobs this node enqueued for it since the queue opened)."""
        if not self._specs:
            await trio.lowlevel.checkpoint()
            return []
        marks = await self._store.ticks()
        now = self._clock()
        return [
            {
                "name": spec.name,
                "schedule": spec.schedule,
                "task": spec.task,
                "tz": spec.tz,
                "next_run": next_run(spec, marks.get(spec.name), now),
                "last_tick": marks.get(spec.name),
                "enqueued": self.enqueued[spec.name],
            }
            for spec in self._specs
        ]

    async def run(self) -> None:
        """Enqueue the schedules' ticks until cancelled (returns at once with no schedule)."""
        if not self._specs:
            return
        failures = 0
        while True:
            leading = self._leading()
            retry_at = math.inf
            if not leading:
                self._marks = None  # a leader may take ticks meanwhile: read the marks again once leading
            else:
                try:
                    await self._take_due()
                    failures = 0
                except Exception as exc:  # the store out of reach: try again later, the queue goes on
                    failures += 1
                    pause = min(_RETRY_FIRST * 2 ** (failures - 1), _RETRY_MAX)
                    emit(
                        logging.ERROR,
                        "cron: the store failed (%s); trying again in %g s",
                        error_text(exc),
                        pause,
                        extra={"error": error_text(exc), "retry_in": pause, "failures": failures},
                    )
                    self._marks = None
                    retry_at = trio.current_time() + pause
            now = self._clock()
            wake = min(spec.next_tick(now) for spec in self._specs) - self._offset + _SLACK
            if not leading:
                wake = min(wake, trio.current_time() + self._poll_interval)
            await trio.sleep_until(min(wake, retry_at))

    async def _take_due(self) -> None:
        """Take every schedule's due tick (its latest at or before now, past its mark); baselines first."""
        if self._marks is None:
            self._marks = await self._store.ticks()
        marks = self._marks
        unseen = [spec for spec in self._specs if spec.name not in marks]
        if unseen:
            now = self._clock()
            for spec in unseen:
                await self._store.add_tick(spec.name, now, None)
                emit(
                    logging.INFO,
                    "cron %s: first seen by this store; its first tick is the next after now (%s)",
                    spec.name,
                    spec.schedule,
                    extra={"cron": spec.name, "baseline": now},
                )
            # Another node may have recorded a mark first: the store's stands.
            marks = self._marks = await self._store.ticks()
        for spec in self._specs:
            now = self._clock()
            due = spec.last_tick(now)
            mark = marks.get(spec.name)
            if mark is None or due <= mark:
                continue  # (no mark: the baseline above failed to stick; never a tick from before it)
            key = tick_key(spec.name, due)
            job = self._resolve(JobSpec(spec.task, copy.deepcopy(spec.payload), key=key), now)
            added = await self._store.add_tick(spec.name, due, job)
            marks[spec.name] = due  # the store's mark is at or after it now, whoever took it
            if added is None:
                emit(
                    logging.DEBUG,
                    "cron %s: tick %s was taken already",
                    spec.name,
                    key,
                    extra={"cron": spec.name, "tick": due},
                )
                continue
            self.enqueued[spec.name] += 1
            emit(
                logging.INFO,
                "cron %s: enqueued job %s (%s) for tick %s",
                spec.name,
                added.id,
                spec.task,
                key,
                extra={"cron": spec.name, "tick": due, "job_id": added.id, "task": spec.task},
            )


def next_run(spec: CronSpec, mark: float | None, now: float) -> float:
    """When ``spec`` enqueues next, wall time: its latest tick at or before ``now`` if that is past
    ``mark`` (due, not taken yet), else its first tick after ``now``."""
    if mark is not None:
        due = spec.last_tick(now)
        if due > mark:
            return due
    return spec.next_tick(now)
