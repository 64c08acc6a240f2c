"""The watchdog: workers stuck in an attempt past its deadline give their slot to a replacement.

It sleeps until the earliest attempt deadline plus :data:`STUCK_GRACE`. A
worker still inside an attempt by then (shielded code, a handler that
swallows cancellation, a thread that ignores it) is declared stuck: its job is
failed as hung (and so requeued under a new epoch at its next claim: at once
when the deadline was a heartbeat's, after the backoff when it was the
timeout's), and the pool starts a replacement worker. The stuck task exits
when it finally returns, its late outcome refused by the epoch check. So at
most ``workers`` attempts are ever live.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import trio

from .._context import Attempt
from ..stores._base import Failed
from .executor import Executor
from .logs import emit, job_fields

__all__ = ["STUCK_GRACE", "Watchdog"]

#: Seconds an attempt may run past its deadline before its worker is declared stuck.
#: Cancellable handlers return within microseconds of the deadline; only code
#: that shields itself from cancellation gets near this.
STUCK_GRACE = 1.0


class Watchdog:
    """Watches the executor's live attempts; see the module docstring.

    ``on_stuck(attempt)`` does the pool's bookkeeping for a worker declared
    stuck (its slot to a replacement); ``record(outcome, attempt)`` records
    the hung attempt's outcome.
    """

    def __init__(
        self,
        executor: Executor,
        *,
        on_stuck: Callable[[Attempt], None],
        record: Callable[[Failed, Attempt], Awaitable[None]],
    ) -> None:
        self._executor = executor
        self._on_stuck = on_stuck
        self._record = record
        self._at = math.inf
        self._scope: trio.CancelScope | None = None

    def watch(self, deadline: float) -> None:
        """Make sure the watchdog wakes by ``deadline + STUCK_GRACE``."""
        at = deadline + STUCK_GRACE
        if at < self._at:
            self._at = at
            if self._scope is not None:
                self._scope.deadline = at

    async def run(self) -> None:
        """Declare every attempt past its deadline plus :data:`STUCK_GRACE` stuck, then sleep.

        Declaring one awaits the store, and meanwhile workers start attempts
        (a replacement among them) and register their deadlines with
        :meth:`watch`. So after any await the attempts are looked at again,
        and the time to wake is computed from them with no await between that
        and the sleep: a deadline registered at any moment is either in that
        computation or moves the sleep's scope itself.
        """
        live = self._executor.live
        while True:
            now = trio.current_time()
            overdue = [a for a in live() if now >= a.deadline + STUCK_GRACE]
            if overdue:
                for attempt in overdue:
                    await self._declare_stuck(attempt)
                continue
            self._at = min((a.deadline for a in live()), default=math.inf) + STUCK_GRACE
            with trio.CancelScope(deadline=self._at) as self._scope:
                await trio.sleep_forever()
            self._scope = None

    async def _declare_stuck(self, attempt: Attempt) -> None:
        """Give ``attempt``'s slot to a replacement worker and fail its job as hung.

        Only an attempt still registered is declared (it may have returned,
        or been declared already, while the watchdog awaited the store); the
        bookkeeping is done before the store call, in one synchronous step.
        """
        executor = self._executor
        job = attempt.job
        if executor.attempts.get(job.id) is attempt:
            del executor.attempts[job.id]
        elif attempt in executor.lingering:
            executor.lingering.remove(attempt)
        else:
            return
        self._on_stuck(attempt)
        emit(
            logging.WARNING,
            "job %s (%s): its worker is stuck %gs past the attempt's deadline; a new worker takes its slot",
            job.id,
            job.task,
            STUCK_GRACE,
            extra=job_fields(job),
        )
        if not attempt.ended:
            attempt.ended = True
            error = (
                f"AttemptHung: attempt still running {STUCK_GRACE:g}s after its deadline "
                "(shielded from cancellation, or blocked in a call that ignores it); its worker was replaced"
            )
            await self._record(executor.hung(attempt, error), attempt)
