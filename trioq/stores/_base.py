"""The Store seam: what the runtime needs from a place that keeps jobs.

The runtime talks to a store only through these async methods, and never
assumes the store lives in its own process: a later PostgreSQL store
implements the same calls in SQL. Every store passes the conformance suite,
:mod:`trioq.stores.conformance`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeAlias, runtime_checkable

import attrs
import msgspec

from .._model import InvalidJob, Job, JobState, Limit

__all__ = [
    "Added",
    "CancelResult",
    "ClaimRequest",
    "Failed",
    "IdMaker",
    "JobFilter",
    "NewJob",
    "Outcome",
    "Released",
    "Snoozed",
    "Store",
    "StoreConfig",
    "Succeeded",
    "no_limits",
]


class NewJob(msgspec.Struct, frozen=True, gc=False):
    """A validated job on its way into a store: defaults resolved.

    ``delay`` is seconds from now on the store's own clock (a finite number
    >= 0): the store sets ``run_at``, as a shared store's clock is not the
    caller's (DESIGN.md section 2: delays travel as durations).

    A struct the cyclic GC never tracks (it holds no cycle: the payload cannot
    refer back to it), so a batch of 10,000 of them adds nothing for the
    collector to walk; creating one costs a third of a frozen attrs class.

    ``queue`` names the queue it waits in and ``tenant`` whom it runs for
    (checked by the runtime: :func:`~trioq._model.label_problem`).
    ``deadline``: seconds from now (the store's clock) by which the job must
    start, else the store cancels it (``None``: never). ``limits``: the
    concrete limit keys it holds while it runs (each resolves through
    ``StoreConfig.limits``).

    ``after``: its parents, each a job id the store holds or an ``int``, the
    index of an earlier job of the same :meth:`Store.add` call (the runtime
    checks that ``0 <= i <`` the job's own index; an earlier job that an
    idempotency key resolved to an existing job stands for that job). The
    flow rules every store keeps:

    - A parent id the store does not hold (never added, or evicted) is
      :class:`~trioq.InvalidJob` (``field="after"``), inserting none of the batch.
    - A job whose parents all succeeded already is added as if it had none.
      One with a parent that is dead or cancelled is added ``CANCELLED`` at
      once, its error ``"ParentFailed: parent <id> is dead"`` (or
      ``cancelled``). Otherwise it is ``WAITING``: kept, keyed, counted,
      cancellable, its deadline running, never claimed, and not counted as
      pending by ``max_pending`` or ``StoreConfig.defer_past``.
    - When a waiting job's last unsucceeded parent succeeds, it goes ``READY``
      (``SCHEDULED`` while its ``run_at``, enqueue time plus ``delay``, is
      still ahead) inside that transition, never deferred; ``on_ready`` /
      ``on_scheduled`` hear of it.
    - When a parent ends dead or cancelled (a failure, a cancel, an expiry, a
      cascade), each of its waiting children is cancelled in that transition,
      its error naming the parent as above, and so on down the flow.
    - :meth:`Store.retry` of such a parent makes each job cancelled because of
      it wait again (or, if another of its parents is dead or cancelled, stay
      cancelled, now because of that one), and so on down the flow. A retry
      of a job whose parent is dead or cancelled is refused
      (``InvalidJob``, ``field="after"``, naming the parent); a retried job
      whose parents have not all succeeded waits for them.
    """

    task: str
    payload: dict[str, Any]
    priority: int
    key: str | None
    max_attempts: int
    delay: float = 0.0
    queue: str = "default"
    tenant: str | None = None
    deadline: float | None = None
    limits: tuple[str, ...] = ()
    after: tuple[str | int, ...] = ()


@attrs.frozen
class CancelResult:
    """What :meth:`Store.cancel` did: the job now, and whether it changed.

    A running job's attempt hears of its cancel through
    ``StoreConfig.on_cancel`` (the store's hint), and, were that hint lost,
    through :meth:`Store.extend` answering ``False`` for it.
    """

    job: Job
    changed: bool


class JobFilter(msgspec.Struct, frozen=True, gc=False):
    """Which jobs :meth:`Store.list_jobs` lists: every field that is set narrows the listing.

    ``states``: the jobs in any of these states (empty: every state); ``task``,
    ``queue``, ``tenant``: the jobs with exactly that task name, named queue or
    tenant. The runtime checks the values before a store sees them.
    """

    states: tuple[JobState, ...] = ()
    task: str | None = None
    queue: str | None = None
    tenant: str | None = None


class Added(list[Job]):
    """What :meth:`Store.add` returns: the jobs, in the order asked for (a list), and ``existing``, the
    indexes of those an idempotency key found (the job that held the key, as it is now)."""

    __slots__ = ("existing",)

    def __init__(self, jobs: Iterable[Job] = (), existing: Iterable[int] = ()) -> None:
        super().__init__(jobs)
        self.existing = frozenset(existing)


class KeyClash(InvalidJob):
    """An :class:`~trioq.InvalidJob` (``field`` naming the key): the idempotency key is held by a job of
    another task. The HTTP API answers it 409 where other bad fields are 400."""


def key_clash(key: str, holder: str, task: str, where: str = "") -> KeyClash:
    """The error of an add whose idempotency ``key`` is held by a job of task ``holder``, not ``task``."""
    return KeyClash(
        f"{where}key {key!r:.80} is held by a job of task {holder!r:.80}, not {task!r:.80}: an idempotency key"
        " names one piece of work; give this one a key of its own",
        field=f"{where}key",
    )


class ClaimRequest(msgspec.Struct, frozen=True, gc=False):
    """What :meth:`Store.claim` is asked for: up to ``limit`` jobs for node ``node``.

    ``lease`` is how long, in seconds of the store's clock, the claims stay
    this node's without :meth:`Store.extend`; a shared store's
    :meth:`Store.rescue` puts back the running jobs of a node whose lease
    lapsed. ``queues``: the named queues to claim from (``None``: all of them).
    """

    node: str
    limit: int
    lease: float = 30.0
    queues: tuple[str, ...] | None = None


class Succeeded(msgspec.Struct, frozen=True, gc=False):
    """The attempt of ``job_id`` under ``epoch`` returned ``result``: the job succeeded.

    A result the store cannot hold (not JSON, too large, nested too deep)
    fails the job without retry instead, its error the ``InvalidJob`` saying
    why: such an attempt will never succeed.
    """

    job_id: str
    epoch: int
    result: Any = None


class Failed(msgspec.Struct, frozen=True, gc=False):
    """The attempt failed with ``error`` (``"Type: message"``; ``traceback`` where it was an exception).

    ``retry_in``: run again after that many seconds (the store applies it on
    its own clock; the job is dead instead once its attempts reach
    ``max_attempts``), or ``None``: no retry, dead now (``trioq.NoRetry``,
    an exception type in the task's ``no_retry``, an unstorable result).
    The attempt counts either way. Error texts are taken as they are; the
    store keeps them storable (``storable_text``).
    """

    job_id: str
    epoch: int
    error: str
    retry_in: float | None
    traceback: str | None = None


class Released(msgspec.Struct, frozen=True, gc=False):
    """The attempt was cut off (shutdown, a lost worker): the job goes back to ``ready``, uncounted."""

    job_id: str
    epoch: int


class Snoozed(msgspec.Struct, frozen=True, gc=False):
    """The handler raised ``trioq.Snooze``: run the job again after ``delay`` seconds, uncounted."""

    job_id: str
    epoch: int
    delay: float


#: What became of one attempt, fenced by ``(job_id, epoch)``: see :meth:`Store.complete`.
Outcome: TypeAlias = Succeeded | Failed | Released | Snoozed


def no_limits(key: str) -> Limit | None:
    """``StoreConfig.limits`` when no limit is declared: every key bounds nothing, and a store that
    finds this very function there may skip looking at keys at all."""
    return None


@attrs.frozen
class StoreConfig:
    """What the runtime hands a store when it opens it.

    ``clock`` returns wall-clock seconds (the runtime derives it from
    trio's clock so a mock clock drives it). A store may call it from its
    worker threads (PostgreSQL's claims read it once they hold a limit key's
    locks); one that must run in trio's thread is called through
    ``trio.from_thread`` there. ``node`` names this
    runtime: its claims are this node's, and a session releases only this
    node's running jobs when it ends.

    The hints (any of them may come from another process, late, or not at
    all; the runtime polls as well): ``on_ready(n)``: ``n`` jobs may have
    become claimable. ``on_scheduled(run_at)``: a job was scheduled for
    ``run_at`` (or has a deadline then), so the runtime's timer can wake in
    time to call :meth:`Store.promote`. ``on_cancel(job_id,
    epoch)``: the running job ``job_id`` was cancelled, so the attempt under
    ``epoch`` should stop. ``on_finished(job)``: the terminal snapshot of each
    job in ``watched`` (ids someone waits for; the set may change at any
    moment) as it becomes terminal (success, death, cancel), whoever made it
    so; an in-process store calls it inside the transition, before anything
    (the ``max_retained`` bound) can evict the job. Hints must not call the
    store.

    ``limits(key)``: the :class:`~trioq._model.Limit` a job's limit key has
    (``None``: none), which claims enforce (the registry's ``LimitBook.resolve``;
    :func:`no_limits` when it declares none, which a store may take as leave to
    claim without looking at keys).

    ``fairness``: ``None`` (plain priority, then ``run_at``, then FIFO) or a
    ``{tenant: weight}`` mapping (unlisted tenants, and jobs without one, weigh
    1.0): among claimable jobs of the best priority the next claim goes to the
    tenant furthest behind its weighted share (start-time fair queueing), FIFO
    within a tenant.

    ``defer_past``: ``None`` (no admission bound here; ``add(max_pending=)``
    may still refuse) or ``N``: a job added while ``N`` or more jobs are ready
    or scheduled (the batch's earlier jobs counted), or while any job is
    deferred, goes ``DEFERRED`` instead: stored, keyed, counted, cancellable,
    its deadline running, but never claimed. The store *admits* deferred jobs
    (to ``READY``, or ``SCHEDULED`` if their ``run_at`` is still ahead) oldest
    first, by enqueue order (with ``fairness``: the tenant furthest behind its
    weighted share of admissions first, oldest first within a tenant), while
    fewer than ``N`` jobs are ready or scheduled: inside the transition that
    made the room (a claim, a cancel, an expiry, a purge) and when a session
    opens. Jobs coming back from ``RUNNING`` (a retry, a snooze, a release)
    are never deferred and may take the count past ``N``. On a shared store
    the bound is global: every node must open with the same ``N``. A job
    admitted ready counts for ``on_ready``; a deferred job's deadline is
    passed to ``on_scheduled``.

    ``takers()``: how many claimed jobs this node's idle workers would take at
    once, by named queue (``None``: jobs of any queue), as a claim would ask;
    ``{}`` when none would. A store may then claim jobs for the node inside a
    transition that makes them claimable (an add, a parent's success
    releasing its children), by the rules a claim follows (a new epoch, the
    node's lease, the jobs a claim would take first), at most that many, and
    hand them to ``on_claimed(jobs)``, which runs them as if a claim had
    returned them. A store that does neither needs neither.
    """

    clock: Callable[[], float]
    retention: float = 3600.0
    max_retained: int = 100_000
    node: str = "local"
    on_ready: Callable[[int], None] = lambda n: None
    on_scheduled: Callable[[float], None] = lambda run_at: None
    on_cancel: Callable[[str, int], None] = lambda job_id, epoch: None
    watched: Container[str] = ()
    on_finished: Callable[[Job], None] = lambda job: None
    limits: Callable[[str], Limit | None] = no_limits
    fairness: Mapping[str, float] | None = None
    defer_past: int | None = None
    takers: Callable[[], Mapping[str | None, int]] = dict
    on_claimed: Callable[[Sequence[Job]], None] = lambda jobs: None


class IdMaker:
    """Makes job ids: a random per-process prefix and a counter, unique and cheap.

    Ids look like ``"5f1c9a2be07d-1a"`` (``width=10``: ``"5f1c9a2be07d-000000001a"``). The
    prefix is fresh for every maker, so ids do not repeat across restarts of a durable store.
    """

    def __init__(self, *, width: int = 0) -> None:
        self._prefix = secrets.token_hex(6) + "-"
        self._n = 0
        #: Zero-pad the counter to this many hex digits (0: none): a database index then receives
        #: one maker's ids in order, and fills its pages instead of splitting them.
        self._format = f"0{width}x" if width else "x"

    def __call__(self) -> str:
        self._n += 1
        return f"{self._prefix}{self._n:{self._format}}"


@runtime_checkable
class Store(Protocol):
    """The async protocol every job store implements.

    Epoch rules: :meth:`claim` returns each job under a new epoch; the outcomes
    of :meth:`complete` and the pairs of :meth:`extend` name that epoch and are
    refused once it is stale, so an attempt that lost its job can never
    complete it.

    Cancellation: a method that changes jobs is not a cancel point once it has
    changed them. A cancel that arrives while it waits for its record to be
    durable is delivered at the caller's next checkpoint, so a cancelled caller
    never misses a transition that happened (nor the follow-up work, such as
    waking workers). :meth:`sync` only waits, and may be cancelled.
    """

    #: Whether the runtime gathers outcomes into batches for :meth:`complete` (a store whose every
    #: call is a round trip) instead of completing each attempt inline (an in-process store).
    batch_outcomes: bool

    # Members a store may add, which the runtime reads if present (so they are not part of the
    # checked protocol): ``lease`` (float seconds), the lease the runtime claims and extends with
    # instead of its default 30 s; ``leading() -> bool``, whether this session is the one node
    # that runs store-wide upkeep now (rescue and eviction; without it, every session does);
    # ``async has_pending() -> bool``, whether any job is ready, scheduled, running, deferred or waiting, when the
    # store answers that cheaper than :meth:`counts` (``join()`` asks it).

    def session(self, config: StoreConfig) -> AbstractAsyncContextManager[None]:
        """Open the store for one queue; leaving the block closes it."""
        ...

    async def add(self, jobs: Sequence[NewJob], *, max_pending: int | None = None) -> Added:
        """Insert ``jobs`` all or nothing; existing idempotency keys return their job.

        Returns an :class:`Added`: the jobs in order, and the indexes of those whose key found a job
        that held it (returned as it is, nothing inserted for it). Raises
        :class:`~trioq.QueueFull` (inserting none) if the new jobs would
        take ready plus scheduled jobs past ``max_pending``, and
        :class:`~trioq.InvalidJob` (inserting none, its ``field`` naming the
        job's field) for a task name, key or payload the store cannot hold
        (see :func:`~trioq._model.name_problem` and ``MAX_VALUE_BYTES``), and for a key
        held by a job of another task (``field`` naming the key: one key, one kind of work).
        Returns once the jobs are durable; a worker may claim them before
        that (a job that runs and is then lost to a crash was never
        acknowledged to anyone). If making them durable fails, ``add``
        raises, yet the jobs may already have run.
        """
        ...

    async def claim(self, request: ClaimRequest) -> list[Job]:
        """Claim up to ``request.limit`` of the best ready jobs for ``request.node``.

        Each comes back ``running`` under a new epoch, in the order they
        should run (priority, then ``run_at``, then enqueue order); fewer (or
        none) when fewer are ready. Only jobs of ``request.queues`` (all
        queues when ``None``) that are not paused are claimed. A ready job
        found past its deadline is cancelled instead (its error says so). A claim need not be durable when it
        returns: after a crash, recovery puts running jobs back to ready
        anyway, so a lost claim record changes nothing a caller could see.
        """
        ...

    async def extend(self, node: str, held: Sequence[tuple[str, int]], lease: float) -> list[bool]:
        """Renew ``node``'s lease on the running jobs ``held`` (``(job_id, epoch)`` pairs) for ``lease`` seconds.

        Returns, for each, whether that epoch still holds the job: ``False``
        once it was cancelled, rescued, or finished by anyone. ``held`` may be
        empty: the runtime renews every third of the lease whatever it holds
        (the node's heartbeat), and counts its lease from when the last call
        that returned was made. An in-process store, whose only node is its
        runtime, keeps no lease and only answers.
        """
        ...

    async def complete(self, outcomes: Sequence[Outcome]) -> list[JobState | None]:
        """Apply each outcome of ``outcomes`` under its epoch, in order.

        Returns, for each, the state the job is in now, or ``None`` when the
        outcome was refused (its epoch is stale: the job was cancelled,
        rescued or completed already) and nothing changed. Never fails on an
        outcome's content: an unstorable result fails its job without retry,
        an error text is kept made storable. Need not be durable when it
        returns (the log commits the records with its next batch); whoever
        reports an outcome calls :meth:`sync` first. A call a cancel stops is
        made again by the runtime, so an outcome applied already must be
        refused the second time (its epoch no longer runs), never applied twice.
        """
        ...

    async def rescue(self) -> int:
        """Put back to ``ready`` (uncounted, under a new epoch at the next claim) every running job whose
        node's lease lapsed; returns how many. A store with one node has nothing to rescue (0)."""
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
        """Make due scheduled jobs ready and cancel never-started jobs past their deadline; returns the
        next time either is due (the earliest ``run_at`` still waiting or deadline still ahead)."""
        ...

    async def evict(self) -> int:
        """Drop terminal jobs past retention; returns how many."""
        ...

    async def counts(self) -> dict[str, int]:
        """Jobs per state, keyed by the state's string value."""
        ...

    async def pause(self, queue: str) -> bool:
        """Stop claims from the named queue ``queue`` for every node, until :meth:`resume`; durable
        like a transition. Running attempts are left to finish. Returns whether it was running."""
        ...

    async def resume(self, queue: str) -> bool:
        """Let claims take jobs of ``queue`` again (waking the workers); returns whether it was paused."""
        ...

    async def paused(self) -> list[str]:
        """The paused queues' names, sorted."""
        ...

    async def jobs(self, states: Collection[JobState], *, limit: int = 100) -> list[Job]:
        """Snapshots of up to ``limit`` jobs in ``states``, oldest enqueued first.

        For checks and listings, not hot paths: a store may scan to answer.
        """
        ...

    async def list_jobs(self, where: JobFilter, *, limit: int, after_id: str | None = None) -> list[Job]:
        """Snapshots of up to ``limit`` jobs that ``where`` takes, newest enqueued first: a page of a
        listing. ``after_id``: the last job of the previous page; the page holds the jobs enqueued
        before it (``None``: from the newest). Raises :class:`~trioq.InvalidJob` (``field="after_id"``)
        when the store holds no job ``after_id`` (never one, or evicted since: list from the first
        page again).

        For operators and dashboards, not hot paths: a store answers from an index where it has one
        (see its docs), and may scan.
        """
        ...

    async def add_tick(self, name: str, tick: float, job: NewJob | None) -> Job | None:
        """Enqueue ``job`` for cron schedule ``name``'s tick at wall time ``tick``, unless this store
        already recorded a tick at or after ``tick`` for ``name``; returns the job, or ``None`` when
        the tick was taken already (nothing changes then).

        Recording ``tick`` as ``name``'s last and inserting the job happen atomically, and are
        durable like :meth:`add` when this returns: however many nodes (or leaders, one after
        another) call it for one tick, one job is enqueued. The job carries its tick's idempotency
        key (``"cron:<name>:<tick>"``); should a job hold that key already, the tick counts as
        taken (``None``, the mark recorded). The job is never refused for ``max_pending`` (a
        refused tick would be lost); ``StoreConfig.defer_past`` applies as to any add.

        ``job=None`` records a baseline: ``tick`` becomes ``name``'s mark only if the store has
        none for it (the first session that knows a schedule records when it opened, so that
        no tick before it runs), and nothing is enqueued; returns ``None``. Marks only move
        forward, and outlive sessions as jobs do. Raises :class:`~trioq.InvalidJob` for a
        ``name`` that is not a label, a ``tick`` that is not a finite number, or a job the
        store cannot hold (recording nothing).
        """
        ...

    async def ticks(self) -> dict[str, float]:
        """The last tick recorded (or the baseline) for each cron schedule name, wall-clock seconds."""
        ...
