"""The Store seam: what the runtime needs from a place that keeps jobs.

The runtime talks to a store only through these async methods, and never
assumes the store lives in its own process: a later PostgreSQL store
implements the same calls in SQL. Every store passes the conformance suite in
``tests/stores/``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Container, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

import attrs
import msgspec

from .._model import Job, JobState

__all__ = ["CancelResult", "IdMaker", "NewJob", "Store", "StoreConfig"]


class NewJob(msgspec.Struct, frozen=True, gc=False):
    """A validated job on its way into a store: defaults resolved, ``run_at`` absolute.

    A struct the cyclic GC never tracks (it holds no cycle: the payload cannot
    refer back to it), so a batch of 10,000 of them adds nothing for the
    collector to walk; creating one costs a third of a frozen attrs class.
    """

    task: str
    payload: dict[str, Any]
    priority: int
    key: str | None
    max_attempts: int
    run_at: float


@attrs.frozen
class CancelResult:
    """What :meth:`Store.cancel` did: the job now, whether it changed, and the
    epoch of the attempt that was running (to stop it), if one was."""

    job: Job
    changed: bool
    running_epoch: int | None = None


@attrs.frozen
class StoreConfig:
    """What the runtime hands a store when it opens it.

    ``clock`` returns wall-clock seconds (the runtime derives it from
    ``trio.current_time()`` so a mock clock drives it). ``on_ready(n)`` is the
    wake-up signal: the store calls it whenever ``n`` jobs may have become
    claimable. ``on_scheduled(run_at)`` tells the runtime's timer that a job
    was scheduled for ``run_at`` so it can wake in time.

    ``watched`` holds the ids of jobs someone waits for (it may change at any
    moment); ``on_finished(job)`` gets the terminal snapshot of each watched
    job as it becomes terminal (success, death, cancel), whoever made it so,
    called synchronously inside the transition, before anything (the
    ``max_retained`` bound) can evict the job. It must not call the store.
    """

    clock: Callable[[], float]
    retention: float = 3600.0
    max_retained: int = 100_000
    on_ready: Callable[[int], None] = lambda n: None
    on_scheduled: Callable[[float], None] = lambda run_at: None
    watched: Container[str] = ()
    on_finished: Callable[[Job], None] = lambda job: None


class IdMaker:
    """Makes job ids: a random per-process prefix and a counter, unique and cheap.

    Ids look like ``"5f1c9a2be07d-1a"``. The prefix is fresh for every maker, so
    ids do not repeat across restarts of a durable store.
    """

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(6) + "-"
        self._n = 0

    def __call__(self) -> str:
        self._n += 1
        return f"{self._prefix}{self._n:x}"


@runtime_checkable
class Store(Protocol):
    """The async protocol every job store implements.

    Epoch rules: :meth:`claim` returns the job under a new epoch; :meth:`succeed`,
    :meth:`fail`, :meth:`release` and :meth:`heartbeat` name that epoch and are
    refused (``False`` / ``None``) once it is stale, so an attempt that lost its
    job can never complete it.

    Cancellation: a method that changes jobs is not a cancel point once it has
    changed them. A cancel that arrives while it waits for its record to be
    durable is delivered at the caller's next checkpoint, so a cancelled caller
    never misses a transition that happened (nor the follow-up work, such as
    waking workers). :meth:`sync` only waits, and may be cancelled.
    """

    def session(self, config: StoreConfig) -> AbstractAsyncContextManager[None]:
        """Open the store for one queue; leaving the block closes it."""
        ...

    async def add(self, jobs: Sequence[NewJob], *, max_pending: int | None = None) -> list[Job]:
        """Insert ``jobs`` all or nothing; existing idempotency keys return their job.

        Raises :class:`~trioq.QueueFull` (inserting none) if the new jobs would
        take ready plus scheduled jobs past ``max_pending``, and
        :class:`~trioq.InvalidJob` (inserting none, its ``field`` naming the
        job's field) for a task name, key or payload the store cannot hold
        (see :func:`~trioq._model.name_problem` and ``MAX_VALUE_BYTES``).
        Returns once the jobs are durable; a worker may claim them before
        that (a job that runs and is then lost to a crash was never
        acknowledged to anyone). If making them durable fails, ``add``
        raises, yet the jobs may already have run.
        """
        ...

    async def claim(self) -> Job | None:
        """Claim the best ready job (running, new epoch), or ``None`` if none is ready.

        A claim need not be durable when it returns: after a crash, recovery
        puts running jobs back to ready anyway, so a lost claim record changes
        nothing a caller could see (any later durable record makes it durable
        too, since logs keep order).
        """
        ...

    async def heartbeat(self, job_id: str, epoch: int) -> bool:
        """Whether ``epoch`` still owns the running job ``job_id``."""
        ...

    async def succeed(self, job_id: str, epoch: int, result: Any, *, durable: bool = True) -> bool:
        """Record success; ``False`` (and nothing changes) if the epoch is stale.

        Returns a flag, not a snapshot: this is the hottest call of a drain, and
        the caller knows the outcome already. Raises
        :class:`~trioq.InvalidJob`, changing nothing, for a result the store
        cannot hold (the caller then fails the attempt with that error). With ``durable=False`` it may
        return before the record is durable; call :meth:`sync` before telling
        anyone the job succeeded.
        """
        ...

    async def sync(self, job_id: str | None = None) -> None:
        """Until every transition applied so far (or, with ``job_id``, every one of that job's)
        is as durable as the store promises.

        With ``job_id`` a store that logs waits for that job's last record
        alone: a job whose outcome is durable already returns at once, and
        other jobs' records waiting for a later commit are left to it. A job
        the store no longer holds (evicted) waits for every transition. Only
        waits: it may be cancelled.
        """
        ...

    async def fail(self, job_id: str, epoch: int, error: str, retry_at: float) -> Job | None:
        """Record a failed attempt: scheduled at ``retry_at``, or dead at max attempts.

        Any ``error`` text is taken: the store keeps it made storable
        (:func:`~trioq._model.storable_text`: lone surrogates escaped, cut at
        ``MAX_ERROR_CHARS``), never failing on it.
        """
        ...

    async def release(self, job_id: str, epoch: int) -> Job | None:
        """Give a running job back to ``ready`` without counting the attempt."""
        ...

    async def get(self, job_id: str) -> Job:
        """A snapshot; raises :class:`~trioq.JobNotFound`."""
        ...

    async def cancel(self, job_id: str) -> CancelResult:
        """Cancel a non-terminal job; a terminal one is returned unchanged."""
        ...

    async def retry(self, job_id: str) -> Job:
        """Send a dead or cancelled job back to ``ready`` with attempts reset."""
        ...

    async def promote(self) -> float | None:
        """Make due scheduled jobs ready; returns the next ``run_at`` still waiting."""
        ...

    async def evict(self) -> int:
        """Drop terminal jobs past retention; returns how many."""
        ...

    async def counts(self) -> dict[str, int]:
        """Jobs per state, keyed by the state's string value."""
        ...

    async def jobs(self, states: Collection[JobState], *, limit: int = 100) -> list[Job]:
        """Snapshots of up to ``limit`` jobs in ``states``, oldest enqueued first.

        For checks and listings, not hot paths: a store may scan to answer.
        """
        ...
