"""The producer: free workers ask it for jobs; it claims them from the store in batches.

A worker with nothing to do calls :meth:`Producer.take`. When no claimed job
is waiting for a worker, the caller claims for itself and for every worker
parked behind it (``ClaimRequest.limit``: the free slots), keeps the first and
hands out the rest; when none is ready it parks until a wake-up hint
(:meth:`Producer.wake`, the store's ``on_ready``) or the next poll. Hints are
only hints (they may come from another process, late, or not at all): every
``poll_interval`` seconds :meth:`Producer.poll` wakes a parked worker to look
again, so a lost one strands nobody. Only one claim is in flight at a time: with a remote store, workers
that free up meanwhile wait for its batch rather than each asking the store.

An in-process store answers a claim without waiting, so there each worker
claims one job for itself (``limit=1``), the hot path of a drain.
"""

from __future__ import annotations

import collections
import math
import random
from collections.abc import Sequence

import trio

from .._model import Job
from ..stores._base import ClaimRequest, Released, Store

__all__ = ["Producer"]


#: The poll's own generator: drawing from the global one would shift a host program's seeded sequence.
_jitter = random.Random()
#: How many cancels of claims this producer had not seen it keeps (see :meth:`Producer.drop`).
_UNSEEN_KEPT = 1024


class Producer:
    """Hands claimed jobs to free workers; see the module docstring.

    ``node``, ``lease`` and ``queues`` (the named queues to claim from;
    ``None``: all) go into every claim; ``poll_interval`` bounds how long a
    parked worker waits for a hint (``math.inf``: hints only).
    """

    def __init__(
        self, store: Store, *, node: str, lease: float, poll_interval: float, queues: tuple[str, ...] | None = None
    ) -> None:
        self._store = store
        self._node = node
        self._lease = lease
        self._queues = queues
        self._poll_interval = poll_interval
        self._one = ClaimRequest(node, 1, lease, queues)
        self._lot = trio.lowlevel.ParkingLot()
        self._generation = 0  # moves on with every hint: a claim that raced one looks again
        self._claimed: collections.deque[Job] = collections.deque()  # claimed, waiting for a worker
        self._claiming = False
        self._asked = 0  # parked workers the claim in flight claims for (its caller aside)
        self._parked = 0  # workers parked in the lot (its len() is a Python call: this is the hot path)
        self._hinted = 0  # hints heard while a claim was in flight
        # Cancels heard while a claim was in flight that matched nothing yet: the claim may be
        # bringing those very jobs (another node cancelled them before our claim's reply came).
        self._cancelled_in_flight: set[tuple[str, int]] = set()
        # Cancels that matched nothing here, the newest last (at most _UNSEEN_KEPT): a store may be about
        # to hand over those very claims (on_claimed: an add or a success claimed them, and another
        # node cancelled them before that statement's answer came back).
        self._cancelled_unseen: dict[tuple[str, int], None] = {}
        self.stopping = False

    def wake(self, n: int) -> None:
        """The store's hint: ``n`` jobs may have become claimable."""
        self._generation += 1
        if self._claiming:
            # The workers it wakes would see the claim in flight and park
            # again: the claimer wakes them once its claim is back.
            self._hinted += n
        else:
            self._lot.unpark(count=n)

    def stop(self) -> None:
        """Claim nothing more; every parked and later :meth:`take` returns ``None``."""
        self.stopping = True
        self._lot.unpark_all()

    async def take(self) -> Job | None:
        """The next claimed job for the calling worker, or ``None`` once stopping."""
        while not self.stopping:
            if self._claimed:
                return self._claimed.popleft()
            generation = self._generation
            if not self._claiming:
                if not self._parked:  # the hot path: claim one for this worker, inline
                    self._claiming = True
                    self._asked = 0
                    try:
                        jobs = await self._store.claim(self._one)
                    finally:
                        self._claiming = False
                        if self._hinted:
                            self._wake_hinted()
                    if self._cancelled_in_flight:
                        jobs = self._not_cancelled(jobs)
                    if len(jobs) == 1 and not self.stopping:
                        if self._parked:
                            # Workers parked while this claim was in flight:
                            # one of them looks for more (and claims for all).
                            self._lot.unpark()
                        return jobs[0]
                    job = await self._settle_claim(jobs)
                else:
                    job = await self._claim()
                if job is not None:
                    return job
                if self.stopping:
                    break
            if generation == self._generation and not self._claimed:
                self._parked += 1
                try:
                    await self._lot.park()
                finally:
                    self._parked -= 1
        return None

    async def _claim(self) -> Job | None:
        """Claim for this worker and the parked ones; the caller's job, or ``None`` if none was ready."""
        self._claiming = True
        self._asked = self._parked
        try:
            jobs = await self._store.claim(ClaimRequest(self._node, self._asked + 1, self._lease, self._queues))
        finally:
            self._claiming = False
            if self._hinted:
                self._wake_hinted()
        if self._cancelled_in_flight:
            jobs = self._not_cancelled(jobs)
        return await self._settle_claim(jobs)

    def _not_cancelled(self, jobs: list[Job]) -> list[Job]:
        """``jobs`` (a claim just back) without those cancelled while it was in flight (their outcome
        would be refused: they are cancelled already)."""
        cancelled, self._cancelled_in_flight = self._cancelled_in_flight, set()
        return [job for job in jobs if (job.id, job.epoch) not in cancelled]

    def _wake_hinted(self) -> None:
        n, self._hinted = self._hinted, 0
        self._lot.unpark(count=n)

    async def _settle_claim(self, jobs: list[Job]) -> Job | None:
        """Keep the first of ``jobs`` for the caller and hand the rest out (all back, if stopping).

        A store that gives more than asked is served all the same (the extras
        wait here for a worker); one that gives a job twice in a batch is
        believed once.
        """
        if not jobs:
            return None
        if len(jobs) > 1 and len({job.id for job in jobs}) < len(jobs):
            unique: dict[str, Job] = {}
            for job in jobs:
                unique.setdefault(job.id, job)
            jobs = list(unique.values())
        if self.stopping:
            with trio.CancelScope(shield=True):
                await self._store.complete([Released(job.id, job.epoch) for job in jobs])
            return None
        if len(jobs) > 1:
            self._claimed.extend(jobs[1:])
            self._lot.unpark(count=len(jobs) - 1)
        return jobs[0]

    def takers(self) -> int:
        """How many claimed jobs the workers parked here would take at once (none once stopping): those
        that no job waiting here and no claim in flight is meant for."""
        if self.stopping:
            return 0
        return max(self._parked - len(self._claimed) - (self._asked if self._claiming else 0), 0)

    def hand_over(self, jobs: Sequence[Job]) -> None:
        """Jobs the store claimed for this node on its own (``StoreConfig.on_claimed``): served as a claim's
        extras are, each to the next free worker. Once stopping they still wait here, and :meth:`close`
        gives them back. A job whose claim was cancelled before it came is left out (its outcome would be
        refused: it is cancelled already)."""
        unseen = self._cancelled_unseen
        if unseen:
            kept = []
            for job in jobs:
                if (job.id, job.epoch) in unseen:
                    del unseen[job.id, job.epoch]
                else:
                    kept.append(job)
            jobs = kept
        self._claimed.extend(jobs)
        self._lot.unpark(count=len(jobs))

    def waiting(self) -> list[Job]:
        """The jobs claimed for workers that have not taken them yet (their leases are renewed too)."""
        return list(self._claimed)

    def drop(self, job_id: str, epoch: int) -> bool:
        """Forget the waiting claim of ``job_id`` under ``epoch`` (the job was cancelled); whether one was.

        With a claim in flight, the cancel is kept for it (it may be bringing
        that job) and counts as dropped. Otherwise it is kept for a later
        :meth:`hand_over` (the newest :data:`_UNSEEN_KEPT`), and is not.
        """
        for job in self._claimed:
            if job.id == job_id and job.epoch == epoch:
                self._claimed.remove(job)
                return True
        if self._claiming:
            self._cancelled_in_flight.add((job_id, epoch))
            return True
        unseen = self._cancelled_unseen
        unseen[(job_id, epoch)] = None
        if len(unseen) > _UNSEEN_KEPT:
            del unseen[next(iter(unseen))]
        return False

    async def poll(self) -> None:
        """Every ``poll_interval`` seconds, wake one parked worker to look again (runs until cancelled).

        The fallback for lost hints: it claims for every parked worker, so one
        wake-up is enough whatever number of jobs became ready unheard.
        """
        if self._poll_interval == math.inf:
            return
        while True:
            # Jittered within the last tenth of the interval: nodes of a shared store that started
            # together do not all poll it in the same instant, and none waits past the interval.
            await trio.sleep(self._poll_interval * (0.9 + 0.1 * _jitter.random()))
            if self._parked and not self._claimed:
                self.wake(1)

    async def close(self) -> None:
        """Give back the jobs claimed for workers that never took them (after :meth:`stop`)."""
        claimed, self._claimed = list(self._claimed), collections.deque()
        if claimed:
            with trio.CancelScope(shield=True):
                await self._store.complete([Released(job.id, job.epoch) for job in claimed])
