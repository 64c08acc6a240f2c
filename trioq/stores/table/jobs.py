"""The job state machine: one pure, synchronous table that every store shares.

Every transition a job can make is a method here: :meth:`JobTable.add`,
:meth:`~JobTable.claim` (and :meth:`~JobTable.claim_next`), :meth:`~JobTable.succeed`,
:meth:`~JobTable.fail`, :meth:`~JobTable.snooze`, :meth:`~JobTable.release`,
:meth:`~JobTable.cancel`, :meth:`~JobTable.retry`, :meth:`~JobTable.promote`,
:meth:`~JobTable.evict` and :meth:`~JobTable.drop` (docs/state_machine.md lists them,
checked by tests/test_state_machine_doc.py). ``MemoryStore`` calls them
directly; ``WALStore`` logs each transition first and replays the log through
the very same methods, so live operation and recovery cannot drift apart.

Nothing here reads a clock: every method that needs the time takes ``now``
(wall-clock seconds). Nothing here draws random numbers either: a failing
job's next ``run_at`` is decided by the caller and passed in, so a replayed log
reproduces the same table bit for bit.

The table is the single source of truth for *which* transitions are legal:
completion is epoch-guarded (a stale epoch is refused, returning ``None``), and
a transition from the wrong state raises :class:`~trioq.InvalidJob`.
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Callable, Collection, Container, Iterator, Mapping, Sequence
from typing import Any

import msgspec

from ..._model import (
    DEFAULT_QUEUE,
    INT_MAX,
    INT_MIN,
    MAX_ERRORS_KEPT,
    MAX_SNOOZES,
    MAX_VALUE_BYTES,
    FailedAttempt,
    InvalidJob,
    Job,
    JobNotFound,
    JobState,
    check_json,
    deadline_error,
)
from .fair import FairReadyQueue
from .flows import FlowIndex, parent_failed
from .limits import LimitState
from .ready import CHUNK, Fifo, ReadyQueue

#: A named queue's ready jobs: plain priority/FIFO order, or fair across tenants.
AnyReady = ReadyQueue | FairReadyQueue

__all__ = ["Entry", "JobTable", "log_result", "pack_payload", "raw_payload", "stored_result", "trailing_fields"]

_READY = JobState.READY
_SCHEDULED = JobState.SCHEDULED
_RUNNING = JobState.RUNNING
_SUCCEEDED = JobState.SUCCEEDED
_DEAD = JobState.DEAD
_CANCELLED = JobState.CANCELLED
_DEFERRED = JobState.DEFERRED
_WAITING = JobState.WAITING


class Entry(msgspec.Struct, gc=False, eq=False):
    """The table's mutable record of one job. Never handed out: see :meth:`snapshot`.

    ``seq`` is the job's enqueue order (the FIFO tie-break). ``slot`` is a
    per-job count: the token of the queue item that currently stands for this
    job, an item ``(run_at, seq, entry, token)`` in the ready or scheduled
    queue, or, once the job is terminal, ``(finished_at, entry, token)`` in the
    retention queue. Making an item, or leaving every queue, moves the count
    on; an item whose token is not its entry's ``slot`` is stale and is skipped
    when it surfaces (lazy deletion keeps cancel O(1)). Items hold the entry,
    so claiming needs no lookup by id. The count stays a small int, which
    CPython does not allocate.

    Entries are invisible to CPython's cyclic GC (``gc=False``), and so is the
    table's id -> entry dict, which holds nothing else: otherwise every
    collection of the oldest generation rescans every job a store holds, and
    enqueueing a million jobs spent a third of its time in the collector. That
    is safe only while no reference cycle runs through an entry, which the GC
    could not see or free. None does: the table and its queue items refer to
    entries, entries refer to neither (``slot`` is a number, not the item), and
    callers get :class:`~trioq.Job` snapshots, so nothing an entry's ``result``
    refers to can refer back to it. (``tests/test_table.py`` checks that a
    dropped table frees every job.)
    """

    id: str
    task: str
    #: The payload as msgpack bytes: every snapshot decodes its own copy, so
    #: nothing a handler or caller does to ``job.payload`` reaches the table
    #: (or makes it differ from what a log replays).
    packed_payload: bytes
    state: JobState
    priority: int
    key: str | None
    max_attempts: int
    run_at: float
    created_at: float
    seq: int
    attempts: int = 0
    epoch: int = 0
    finished_at: float | None = None
    result: Any = None
    error: str | None = None
    slot: int = 0
    #: The sequence number of the job's last log record (a store that logs sets it; 0: none since open).
    logged: int = 0
    #: The last failed attempts, oldest first: ``(attempt, error, traceback, finished_at)`` tuples.
    errors: tuple[tuple[int, str, str | None, float], ...] = ()
    #: Snoozes since the job was enqueued or last retried (bounded by ``MAX_SNOOZES``).
    snoozes: int = 0
    queue: str = DEFAULT_QUEUE
    tenant: str | None = None
    #: Wall-clock time by which a never-claimed job must start, else it is cancelled (``None``: never).
    deadline: float | None = None
    #: The limit keys its attempts hold (see .limits).
    limits: tuple[str, ...] = ()
    #: The key whose freed slot this ready job was let go for, until it takes it or leaves (see .limits).
    waking: str | None = None
    #: Its parents' ids (see .flows); while it waits, how many have not succeeded; once cancelled
    #: because a parent ended dead or cancelled, that parent's id.
    after: tuple[str, ...] = ()
    unmet: int = 0
    cancelled_by: str | None = None

    def result_value(self) -> Any:
        """The result as snapshots give it: a fresh copy of a non-scalar one (kept packed)."""
        return _decode(self.result) if type(self.result) is bytes else self.result

    def snapshot(self, payload: dict[str, Any] | None = None) -> Job:
        """An immutable :class:`~trioq.Job` copy of this entry as it is now.

        ``payload``: the dict the caller passed to an enqueue, put in the
        snapshot as it is (the table keeps its own packed copy, so nothing the
        caller does to that dict reaches it); without it the packed payload is
        decoded anew.
        """
        return Job(
            self.id,
            self.task,
            _unpack(self.packed_payload) if payload is None else payload,
            self.state,
            self.attempts,
            self.epoch,
            self.priority,
            self.key,
            self.max_attempts,
            self.run_at,
            self.created_at,
            self.finished_at,
            self.result_value(),
            self.error,
            tuple(FailedAttempt(*e) for e in self.errors) if self.errors else (),
            self.queue,
            self.tenant,
            self.deadline,
            self.limits,
            self.after,
        )


class JobTable:
    """Every job a store knows, and the rules for moving them between states.

    Ready jobs wait in their named queue's ready queue, ordered by priority
    (larger first), then ``run_at``, then enqueue order; a claim of several
    queues takes the best head among them, and skips paused queues (their
    jobs stay ready). A never-claimed job whose deadline comes is cancelled
    by the next sweep (:meth:`expire_due`, which :meth:`promote` and
    :meth:`claim_next` run first). Terminal jobs are retained until :meth:`evict` finds them
    older than ``retention`` seconds; beyond ``max_retained`` of them the oldest
    finished is dropped at once, inside the transition that finished the
    newest. Idempotency keys live exactly as long as their job.
    """

    def __init__(self, *, retention: float = 3600.0, max_retained: int = 100_000) -> None:
        if retention < 0:
            raise ValueError(f"retention must be >= 0 seconds, got {retention!r}")
        if max_retained < 0:
            raise ValueError(f"max_retained must be >= 0, got {max_retained!r}")
        self.retention = retention
        self.max_retained = max_retained
        self._jobs: dict[str, Entry] = {}
        self._keys: dict[str, str] = {}  # idempotency key -> job id
        # Items are (run_at, seq, entry, token) in both; see Entry.slot. One
        # ready queue per named queue; claims skip the paused ones.
        self._queues: dict[str, AnyReady] = {}
        # The one ready queue while there is only one and it is not paused (the common case: claims
        # then skip choosing among queues); None otherwise. See _choose.
        self._sole: AnyReady | None = None
        # Makes each named queue's ready queue (see set_fairness).
        self._new_ready: Callable[[], AnyReady] = ReadyQueue
        self._paused: set[str] = set()
        self._scheduled: list[tuple[float, int, Entry, int]] = []
        # (deadline, seq, entry) of never-claimed jobs with a deadline; an item
        # whose entry has started, finished or lost its deadline since is skipped.
        self._deadlines: list[tuple[float, int, Entry]] = []
        # Terminal jobs in the order they finished, as (finished_at, entry)
        # items with lazy deletion like the ready queue (a retried or dropped
        # job's item goes stale); _retained counts the current ones. Evicting
        # the oldest is a pop from the front: no hash lookups into a large
        # table whose old entries have long left the CPU caches.
        self._terminal: Fifo[tuple[float, Entry, int]] = Fifo()
        self._retained = 0
        self._stale = 0  # stale items made since the last rebuild (see _compact_retention)
        # The running jobs: completions look them up here, in a dict of about
        # `workers` entries that stays in the CPU caches, not in the big one.
        self._active: dict[str, Entry] = {}
        self._counts: dict[JobState, int] = dict.fromkeys(JobState, 0)
        self._next_seq = 0
        #: Called with the id of each job dropped by the ``max_retained`` bound
        #: inside a transition (a durable store logs these drops).
        self.on_overflow_drop: Callable[[str], None] | None = None
        #: Ids of jobs whose terminal snapshot ``on_finish`` gets as they finish,
        #: before the ``max_retained`` bound can drop them (see StoreConfig.watched).
        self.watched: Container[str] = ()
        self.on_finish: Callable[[Job], None] = _ignore
        #: Called with each entry a sweep (:meth:`promote`, :meth:`claim_next`) cancelled for
        #: its deadline, right after (a durable store logs it as :meth:`expire`).
        self.on_expire: Callable[[Entry], None] | None = None
        #: Limit keys: slots, tokens, and the jobs passed over (see .limits). Its ``limit_of``
        #: is the store's to set.
        self.limits = LimitState()
        self.limits.paused = self._paused
        #: Called with ``n`` when jobs passed over for a limit are back in the ready queues, and
        #: with a time when a job passed over for a rate will be due then (the store's hints).
        self.on_unblocked: Callable[[int], None] | None = None
        self.on_throttled: Callable[[float], None] | None = None
        #: Admission (``StoreConfig.defer_past``): the ready + scheduled count at and past which a
        #: new job is deferred; deferred jobs are admitted as it drops below (``math.inf``: every
        #: deferred job is admitted, none deferred). ``None``: no admission decision at all, for
        #: replay (an ADD says whether its job was deferred, an ADMIT each admission).
        self.defer_past: float | None = None
        # The deferred jobs in admission order, as ready-queue items (0.0, seq, entry, token) of
        # priority 0: enqueue order, or fair across tenants (see set_fairness).
        self._deferred: AnyReady = ReadyQueue()
        #: Called with each entry a transition admitted, and the time (a durable store logs it).
        self.on_admit: Callable[[Entry, float], None] | None = None
        #: Flows: parent id -> children (see .flows); ``_children`` is its dict, read on every finish.
        self.flows = FlowIndex(self._jobs)
        self._children = self.flows.children

    # ----------------------------------------------------------------- queries

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def entries(self) -> Iterator[Entry]:
        """Every entry, in no promised order (a copy: the table may change meanwhile)."""
        return iter(list(self._jobs.values()))

    def entry(self, job_id: str) -> Entry:
        """The live entry for ``job_id``; raises :class:`~trioq.JobNotFound`."""
        found = self._find(job_id)
        if found is None:
            raise JobNotFound(f"no job with id {job_id!r:.80} (never enqueued, or evicted after retention)")
        return found

    def _find(self, job_id: str) -> Entry | None:
        """The live entry for ``job_id``, or ``None`` (an id that is not a string names no job)."""
        return self._jobs.get(job_id) if isinstance(job_id, str) else None

    def get(self, job_id: str) -> Job:
        """A snapshot of ``job_id``; raises :class:`~trioq.JobNotFound`."""
        return self.entry(job_id).snapshot()

    def by_key(self, key: str) -> Entry | None:
        """The job holding idempotency key ``key``, if any."""
        job_id = self._keys.get(key)
        return None if job_id is None else self.entry(job_id)

    def logged(self, job_id: str) -> int | None:
        """The sequence number of ``job_id``'s last log record (0: none this session), or
        ``None`` for a job the table does not hold (never enqueued, or evicted)."""
        found = self._find(job_id)
        return None if found is None else found.logged

    def holds_key(self, key: str) -> bool:
        """Whether a retained job holds idempotency key ``key``."""
        return key in self._keys

    def counts(self) -> dict[str, int]:
        """Number of jobs in each state, keyed by the state's string value."""
        return {state.value: n for state, n in self._counts.items()}

    def count(self, state: JobState) -> int:
        """Number of jobs in ``state``."""
        return self._counts[state]

    @property
    def pending(self) -> int:
        """Jobs waiting to run: ready plus scheduled (what ``max_ready`` bounds)."""
        return self._counts[_READY] + self._counts[_SCHEDULED]

    @property
    def needs_clock(self) -> bool:
        """Whether :meth:`claim_next` needs the real time: a job may be scheduled, have a deadline, or
        hold a limit key (rates go by the clock)."""
        return bool(self._scheduled) or bool(self._deadlines) or self.limits.used or self._counts[_DEFERRED] > 0

    def paused(self) -> list[str]:
        """The paused queues' names, sorted."""
        return sorted(self._paused)

    def ready_in(self, queue: str) -> int:
        """About how many jobs of ``queue`` are ready (stale items included: a hint's size)."""
        ready = self._queues.get(queue)
        return 0 if ready is None else ready.size

    def next_run_at(self) -> float | None:
        """The earliest ``run_at`` among scheduled jobs, or ``None`` if there are none."""
        heap = self._scheduled
        while heap:
            item = heap[0]
            if item[2].slot == item[3]:
                return item[0]
            heapq.heappop(heap)
        return None

    def next_deadline(self) -> float | None:
        """The earliest deadline of a never-claimed ready, scheduled or deferred job, or ``None``."""
        heap = self._deadlines
        while heap:
            deadline, _, entry = heap[0]
            if _expirable(entry, deadline):
                return deadline
            heapq.heappop(heap)
        return None

    def peek(self, now: float, queues: Collection[str] | None = None) -> Entry | None:
        """The job :meth:`claim_next` would claim at ``now``, without claiming it."""
        self.promote(now)
        ready = self._best(queues)
        if ready is None:
            return None
        item = ready.first()
        assert item is not None  # _best found a current head
        entry: Entry = item[2]
        return entry

    # ------------------------------------------------------------- transitions

    def add(
        self,
        job_id: str,
        task: str,
        payload: dict[str, Any],
        priority: int,
        key: str | None,
        max_attempts: int,
        run_at: float,
        now: float,
        queue: str = DEFAULT_QUEUE,
        tenant: str | None = None,
        deadline: float | None = None,
        limits: tuple[str, ...] = (),
    ) -> tuple[Job, bool]:
        """Insert a new job; returns ``(snapshot, created)``.

        With a ``key`` already held by a retained job, nothing is inserted and
        that job's snapshot comes back with ``created=False``. The job starts
        ``scheduled`` if ``run_at > now``, else ``ready``. ``deadline``: the
        wall-clock time by which it must start (see :meth:`expire`).
        """
        existing = self.add_packed(
            job_id, task, pack_payload(payload), priority, key, max_attempts, run_at, now, queue, tenant, deadline,
            limits,
        )  # fmt: skip
        if existing is not None:
            return self.get(existing), False
        return self._jobs[job_id].snapshot(payload), True

    def add_packed(
        self,
        job_id: str,
        task: str,
        payload: bytes,
        priority: int,
        key: str | None,
        max_attempts: int,
        run_at: float,
        now: float,
        queue: str = DEFAULT_QUEUE,
        tenant: str | None = None,
        deadline: float | None = None,
        limits: tuple[str, ...] = (),
        deferred: bool | None = None,
        after: tuple[str, ...] = (),
    ) -> str | None:
        """:meth:`add` with the payload already msgpack-encoded, and no snapshot.

        Returns ``None`` when the job was inserted, or the id of the job that
        holds ``key``. The arguments are those of a WAL ADD record, whose
        payload replay reads as raw msgpack: this is the replay path.
        ``deferred``: whether the job starts ``deferred`` (replay says);
        ``None``: as :attr:`defer_past` decides (any job deferred already, or
        ready + scheduled at the bound). ``after``: its parents' ids, each one
        the table holds (else :class:`~trioq.InvalidJob`, nothing inserted): it
        starts ``waiting`` while any has not succeeded, ``cancelled`` (never
        deferred either way) if one is dead or cancelled (see .flows).
        """
        if key is not None:
            existing = self._keys.get(key)
            if existing is not None:
                return existing
        if job_id in self._jobs:
            raise InvalidJob(f"job id {job_id!r} is already in use", field="id")
        blocker: Entry | None = None
        unmet = 0
        if after:
            flows = self.flows
            flows.check(after)
            blocker, unmet = flows.blocker(after), flows.unmet(after)
            if blocker is not None or unmet:
                deferred = False  # waiting (or cancelled below): never deferred
        seq = self._next_seq
        self._next_seq = seq + 1
        if deferred is None:
            bound = self.defer_past
            deferred = bound is not None and (self._counts[_DEFERRED] > 0 or self.pending >= bound)
        if blocker is not None or unmet:
            state = _WAITING
        else:
            state = _DEFERRED if deferred else _SCHEDULED if run_at > now else _READY
        entry = self._insert(job_id, task, payload, state, priority, key, max_attempts, run_at, now, seq, queue, tenant)
        if limits:
            entry.limits = limits
            self.limits.used = True
        if deadline is not None:
            entry.deadline = deadline
            if blocker is None:
                heapq.heappush(self._deadlines, (deadline, seq, entry))
        if after:
            entry.after = after
            if state is _WAITING:
                entry.unmet = unmet
                self.flows.link(entry)
            if blocker is not None:  # a parent is dead or cancelled already: cancelled at once
                entry.error = parent_failed(blocker.id, blocker.state)
                entry.cancelled_by = blocker.id
                self._end(entry, _CANCELLED, now)
        return None

    def _insert(
        self,
        job_id: str,
        task: str,
        payload: bytes,
        state: JobState,
        priority: int,
        key: str | None,
        max_attempts: int,
        run_at: float,
        created_at: float,
        seq: int,
        queue: str,
        tenant: str | None,
    ) -> Entry:
        """File a never-run ready, scheduled, deferred or waiting job; returns its entry."""
        if payload == _EMPTY_MAP:
            payload = b""
        entry = Entry(job_id, task, payload, state, priority, key, max_attempts, run_at, created_at, seq)
        if queue != DEFAULT_QUEUE:
            entry.queue = queue
        if tenant is not None:
            entry.tenant = tenant
        self._jobs[job_id] = entry
        self._push(entry)
        if key is not None:
            self._keys[key] = job_id
        self._counts[state] += 1
        return entry

    def claim_next(self, now: float, queues: Collection[str] | None = None) -> Entry | None:
        """Claim the best ready job of ``queues`` (every queue: ``None``) at ``now``, skipping paused queues.

        Due scheduled jobs are promoted first, and never-claimed jobs past
        their deadline cancelled (see :meth:`expire`). The same transition as
        :meth:`claim`, unrolled: this is the hot path.
        """
        scheduled = self._scheduled
        if scheduled and scheduled[0][0] <= now:
            self.promote(now)  # expires deadlines and lets due rate-parked jobs go too
        else:
            if self._deadlines and self._deadlines[0][0] <= now:
                self.expire_due(now)
            if self.limits.used:
                self._unthrottle(now)
        while True:
            sole = self._sole
            if sole is not None and queues is None:
                ready = sole
            else:
                best = self._best(queues)
                if best is None:
                    return None
                ready = best
            while (item := ready.pop()) is not None:
                entry: Entry = item[2]
                if entry.slot == item[3]:
                    if entry.limits and not self._admit(entry, now):
                        break  # passed over (parked): choose again, maybe from another queue
                    counts = self._counts
                    counts[_READY] -= 1
                    counts[_RUNNING] += 1
                    entry.state = _RUNNING
                    entry.slot += 1
                    entry.epoch += 1
                    self._active[entry.id] = entry
                    if entry.limits:
                        self.limits.hold(entry, now)
                    if counts[_DEFERRED]:
                        self.admit_due(now)
                    return entry
            else:
                return None

    def claim(self, job_id: str, now: float | None = None) -> Entry:
        """Move a ready (or scheduled) job to ``running`` under a new epoch.

        Replay calls this with the id a log recorded; live stores reach it via
        :meth:`claim_next`. A scheduled job may be claimed directly because a
        job being due is a matter of the clock, which replay does not consult.
        Nor are limits: the log says the claim happened. The job's limit keys
        are held, and with ``now`` (the claim's time, which a log records for
        a job holding keys) their rate tokens taken.
        """
        entry = self.entry(job_id)
        if entry.state is not _READY and entry.state is not _SCHEDULED:
            raise InvalidJob(
                f"job {job_id!r} is {entry.state.value}; only ready (or, in replay, scheduled) jobs can be claimed",
                field="state",
            )
        self._move(entry, _RUNNING)
        entry.slot += 1
        entry.epoch += 1
        if entry.limits:
            self.limits.hold(entry, now)
        return entry

    def succeed(self, job_id: str, epoch: int, result: Any, now: float) -> Entry | None:
        """Record a successful attempt; ``None`` if ``epoch`` is stale (result discarded).

        Raises :class:`~trioq.InvalidJob`, changing nothing, for a result the
        table cannot keep (see :func:`stored_result`).
        """
        entry = self._running(job_id, epoch)
        if entry is None:
            return None
        stored = stored_result(result)
        entry.attempts += 1
        entry.result = stored
        entry.error = None
        self._finish(entry, _SUCCEEDED, now)
        return entry

    def fail(
        self,
        job_id: str,
        epoch: int,
        error: str,
        retry_at: float | None,
        now: float,
        traceback: str | None = None,
    ) -> Entry | None:
        """Record a failed (or hung, or timed-out) attempt.

        The job is dead once its attempts reach ``max_attempts``, or at once
        when ``retry_at`` is ``None`` (no retry: ``NoRetry``, an unstorable
        result); otherwise it is scheduled to run again at ``retry_at`` (ready
        at once if that has passed). The attempt joins ``errors`` (the last
        ``MAX_ERRORS_KEPT``). ``None`` if ``epoch`` is stale.
        """
        entry = self._running(job_id, epoch)
        if entry is None:
            return None
        entry.attempts += 1
        entry.error = error
        failed = (entry.attempts, error, traceback, now)
        errors = entry.errors
        entry.errors = (*errors[max(len(errors) - MAX_ERRORS_KEPT + 1, 0) :], failed) if errors else (failed,)
        if retry_at is None or entry.attempts >= entry.max_attempts:
            self._finish(entry, _DEAD, now)
        else:
            entry.run_at = retry_at
            self._move(entry, _SCHEDULED if retry_at > now else _READY)
            self._push(entry)
        return entry

    def snooze(self, job_id: str, epoch: int, run_at: float, now: float) -> Entry | None:
        """Put a running job back to wait until ``run_at`` without counting the attempt (``Snooze``).

        The job is scheduled (ready at once if ``run_at`` has passed), its
        ``attempts`` and ``error`` unchanged. Its ``MAX_SNOOZES + 1``-th
        snooze since its enqueue (or last retry) kills it instead, counted as
        a failed attempt with a ``SnoozeLimit`` error: what bounds a handler
        that snoozes forever. ``None`` if ``epoch`` is stale.
        """
        entry = self._running(job_id, epoch)
        if entry is None:
            return None
        if entry.snoozes >= MAX_SNOOZES:
            error = f"SnoozeLimit: the job snoozed {MAX_SNOOZES} times; retry it to start over"
            return self.fail(job_id, epoch, error, None, now)
        entry.snoozes += 1
        entry.run_at = run_at
        self._move(entry, _SCHEDULED if run_at > now else _READY)
        self._push(entry)
        return entry

    def holds(self, job_id: str, epoch: int) -> bool:
        """Whether ``epoch`` still owns the running job ``job_id`` (heartbeats ask this)."""
        return self._running(job_id, epoch) is not None

    def release(self, job_id: str, epoch: int) -> Entry | None:
        """Give a running job back to ``ready`` without counting the attempt.

        Used at shutdown and in recovery for attempts cut off by a crash.
        ``None`` if ``epoch`` is stale.
        """
        entry = self._running(job_id, epoch)
        if entry is None:
            return None
        self._move(entry, _READY)
        self._push(entry)
        return entry

    def cancel(self, job_id: str, now: float) -> tuple[Entry, bool, int | None]:
        """Cancel a job that has not finished; returns ``(entry, changed, running_epoch)``.

        ``running_epoch`` is the epoch of the attempt that was running, so the
        caller can stop it (its late completion is refused anyway), or ``None``.
        Cancelling a terminal job changes nothing (``changed`` is False).
        """
        entry = self.entry(job_id)
        if entry.state.terminal:
            return entry, False, None
        running_epoch = entry.epoch if entry.state is _RUNNING else None
        self._finish(entry, _CANCELLED, now)  # its queue item goes stale: _retain moves the slot on
        if self._counts[_DEFERRED]:
            self.admit_due(now)
        return entry, True, running_epoch

    def retry(self, job_id: str, now: float) -> Entry:
        """Send a dead or cancelled job back to ``ready`` with its attempts reset and no deadline.

        A job with parents goes ``waiting`` instead while any has not succeeded,
        and is refused (:class:`~trioq.InvalidJob`, ``field="after"``) while one
        is dead or cancelled. The jobs cancelled because this one ended so wait
        again, and so on down the flow (see .flows).
        """
        entry = self.entry(job_id)
        if entry.state is not _DEAD and entry.state is not _CANCELLED:
            raise InvalidJob(
                f"job {job_id!r} is {entry.state.value}; only dead or cancelled jobs can be retried",
                field="state",
            )
        unmet = 0
        if entry.after:
            blocker = self.flows.blocker(entry.after)
            if blocker is not None:
                raise InvalidJob(
                    f"job {job_id!r} waits for parent {blocker.id}, which is {blocker.state.value}; "
                    f"retry {blocker.id} first (its cancelled children then wait again)",
                    field="after",
                )
            unmet = self.flows.unmet(entry.after)
        self._retained -= 1  # its retention item goes stale: _push replaces the slot
        entry.attempts = 0
        entry.snoozes = 0
        entry.finished_at = None
        entry.result = None
        entry.deadline = None  # asked for by name: it runs, however late
        entry.run_at = now
        entry.cancelled_by = None
        entry.unmet = unmet
        self._move(entry, _WAITING if unmet else _READY)
        self._push(entry)
        self._compact_retention()
        if self._children.get(job_id):
            self._revive(entry, now)
        return entry

    def _revive(self, parent: Entry, now: float) -> None:
        """Make the jobs cancelled because ``parent`` ended wait again (it was just retried), and
        theirs, down the flow, without their deadlines (the flow was retried, however late: as the
        retried job's own); a job another of whose parents is dead or cancelled stays cancelled, now
        because of that one."""
        flows, children = self.flows, self._children
        stack = [parent]
        while stack:
            revived = stack.pop()
            for child in children.get(revived.id, ()):
                if child.state is not _CANCELLED or child.cancelled_by != revived.id:
                    continue
                other = flows.blocker(child.after)
                if other is not None:
                    child.cancelled_by = other.id
                    child.error = parent_failed(other.id, other.state)
                    continue
                self._retained -= 1
                child.finished_at = None
                child.error = None
                child.cancelled_by = None
                child.deadline = None  # its deadline heap item, if any, is passed over when it comes up
                child.unmet = flows.unmet(child.after)
                self._move(child, _WAITING)
                self._push(child)
                self._compact_retention()
                stack.append(child)

    def promote(self, now: float) -> int:
        """Move scheduled jobs whose ``run_at`` has come to ``ready``; returns how many.

        Never-claimed jobs whose deadline has come are cancelled first (:meth:`expire_due`).
        """
        if self._deadlines and self._deadlines[0][0] <= now:
            self.expire_due(now)
        if self.limits.used:
            self._unthrottle(now)
            self.limits.sweep(now)
        heap = self._scheduled
        promoted = 0
        while heap and heap[0][0] <= now:
            item = heapq.heappop(heap)
            found = item[2]
            if found.slot != item[3]:
                continue
            self._move(found, _READY)
            self._push(found)
            promoted += 1
        return promoted

    def expire_due(self, now: float) -> int:
        """Cancel every never-claimed ready, scheduled or deferred job whose deadline is at or before
        ``now`` (each through :meth:`expire`, then :attr:`on_expire`), then admit deferred jobs into
        the room made (:meth:`admit_due`); returns how many expired."""
        heap = self._deadlines
        expired = 0
        while heap and heap[0][0] <= now:
            deadline, _, entry = heapq.heappop(heap)
            if not _expirable(entry, deadline):
                continue
            self.expire(entry.id, now)
            expired += 1
            if self.on_expire is not None:
                self.on_expire(entry)
        if expired and self._counts[_DEFERRED]:
            self.admit_due(now)
        counts = self._counts
        live = counts[_READY] + counts[_SCHEDULED] + counts[_DEFERRED] + counts[_WAITING]
        if len(heap) > 2 * live + CHUNK:  # claimed and finished jobs leave their items behind
            self._deadlines = [item for item in heap if _expirable(item[2], item[0])]
            heapq.heapify(self._deadlines)
        return expired

    def expire(self, job_id: str, now: float) -> Entry:
        """Cancel a never-claimed ready, scheduled or deferred job for its deadline (its error says so).

        Replay calls this for the record a sweep logged. Raises
        :class:`~trioq.InvalidJob` for a job that has started, finished, or has no deadline.
        """
        entry = self.entry(job_id)
        deadline = entry.deadline
        if deadline is None or not _expirable(entry, deadline):
            raise InvalidJob(
                f"job {job_id!r} is {entry.state.value} (epoch {entry.epoch}, deadline {deadline!r}); only a "
                "never-claimed ready, scheduled or deferred job with a deadline can expire",
                field="state",
            )
        entry.error = deadline_error(entry.created_at, deadline)
        self._finish(entry, _CANCELLED, now)
        return entry

    def admit_due(self, now: float) -> int:
        """Admit deferred jobs while fewer than :attr:`defer_past` jobs are ready or scheduled;
        returns how many. Oldest first (fair across tenants with fairness on); each goes ``ready``,
        or ``scheduled`` if its ``run_at`` is after ``now``, then to :attr:`on_admit`. The store
        hears of them as of let-go jobs (:attr:`on_unblocked`, :attr:`on_throttled`).

        Claims, cancels and expiries call it (a claim and a cancel only when some job is
        deferred); the store calls it when a session opens (with ``math.inf`` for a session
        without a bound: all of them). Nothing happens with :attr:`defer_past` ``None``: so in
        replay, where ADMIT records say what was admitted.
        """
        bound = self.defer_past
        counts = self._counts
        if bound is None or not counts[_DEFERRED]:
            return 0
        deferred = self._deferred
        admitted = ready = 0
        while counts[_READY] + counts[_SCHEDULED] < bound and (item := deferred.pop()) is not None:
            entry: Entry = item[2]
            if entry.slot != item[3] or entry.state is not _DEFERRED:
                continue
            self._admit_one(entry, now)
            admitted += 1
            if entry.state is _READY:
                ready += 1
            elif self.on_throttled is not None:
                self.on_throttled(entry.run_at)
            if self.on_admit is not None:
                self.on_admit(entry, now)
        if ready and self.on_unblocked is not None:
            self.on_unblocked(ready)
        return admitted

    def admit(self, job_id: str, now: float) -> Entry:
        """Admit the deferred job ``job_id`` at ``now`` (to ``ready``, or ``scheduled`` if its
        ``run_at`` is later): the replay of an ADMIT record. Raises :class:`~trioq.InvalidJob`
        for a job that is not deferred."""
        entry = self.entry(job_id)
        if entry.state is not _DEFERRED:
            raise InvalidJob(
                f"job {job_id!r} is {entry.state.value}; only a deferred job can be admitted", field="state"
            )
        self._admit_one(entry, now)  # its deferred item goes stale: _push moves the slot on
        return entry

    def _admit_one(self, entry: Entry, now: float) -> None:
        self._move(entry, _SCHEDULED if entry.run_at > now else _READY)
        self._push(entry)

    def pause(self, queue: str) -> bool:
        """Stop claims from ``queue`` (jobs stay ready); returns whether it was not paused before.

        A job of ``queue`` let go for a freed slot of a limit key (see .limits) gives the slot up:
        the next job parked on that key, of a queue still running, gets it.
        """
        if queue in self._paused:
            return False
        self._paused.add(queue)
        self._choose()
        ready = self._queues.get(queue)
        if ready is not None and self.limits.promised():
            for item in ready:
                entry: Entry = item[2]
                if entry.slot == item[3] and entry.waking is not None:
                    self.limits.left(entry)
            self._let_go(self.limits.drain())
        return True

    def resume(self, queue: str) -> bool:
        """Let claims take ``queue``'s jobs again; returns whether it was paused."""
        if queue not in self._paused:
            return False
        self._paused.discard(queue)
        self._choose()
        self.limits.rewake()  # its parked jobs were not let go while it was paused
        self._let_go(self.limits.drain())
        return True

    def evict(self, now: float) -> list[str]:
        """Drop terminal jobs older than ``retention`` or beyond ``max_retained``.

        Returns the evicted ids (oldest finished first). Their idempotency keys
        are freed with them.
        """
        cutoff = now - self.retention
        evicted: list[str] = []
        while (oldest := self._oldest()) is not None:
            if self._retained <= self.max_retained and oldest.finished_at is not None and oldest.finished_at > cutoff:
                break
            evicted.append(oldest.id)
            self._evict_oldest(oldest)
        return evicted

    def drop(self, job_id: str) -> None:
        """Forget a terminal job entirely (eviction; replay of an eviction record)."""
        entry = self.entry(job_id)
        if not entry.state.terminal:
            raise InvalidJob(f"job {job_id!r} is {entry.state.value}; only terminal jobs can be evicted", field="state")
        self._forget(entry)
        self._compact_retention()

    def _compact_retention(self) -> None:
        """Count one more stale retention item; rebuild once they outnumber the current ones.

        Retries and drops leave their item behind, and an item leaves only at
        the front: a job retried again and again would grow the queue without
        bound. ``_stale`` counts the items made stale since the last rebuild (some
        may have left at the front since: a rebuild then comes a little early),
        so the check is O(1) per call (replay calls this for every DROP record).
        """
        self._stale += 1
        if self._stale > self._retained + CHUNK:
            fresh: Fifo[tuple[float, Entry, int]] = Fifo()
            for item in self._terminal:
                if item[1].slot == item[2]:
                    fresh.append(item)
            self._terminal = fresh
            self._stale = 0

    def _oldest(self) -> Entry | None:
        """The terminal job that finished first (stale items in front are dropped)."""
        terminal = self._terminal
        while (item := terminal.first()) is not None:
            if item[1].slot == item[2]:
                return item[1]
            terminal.popleft()
        return None

    def _evict_oldest(self, oldest: Entry) -> None:
        """Forget the entry :meth:`_oldest` just returned."""
        self._terminal.popleft()
        self._forget(oldest)

    def _forget(self, entry: Entry) -> None:
        """Remove a terminal entry; its retention item, if still queued, goes stale.

        A stale queue item may still hold the entry (a cancelled job's item
        waits in the scheduled heap until its ``run_at``): drop what is heavy.
        """
        entry.slot += 1
        self._retained -= 1
        entry.packed_payload = b""
        entry.result = entry.error = None
        entry.errors = ()
        job_id = entry.id
        del self._jobs[job_id]
        self._counts[entry.state] -= 1
        key = entry.key
        if key is not None and self._keys.get(key) == job_id:
            del self._keys[key]
        if self._children:
            self._children.pop(job_id, None)

    # -------------------------------------------------------------- recovery

    def clear(self) -> None:
        """Forget every job (a checkpoint being replayed rebuilds the table)."""
        self._jobs.clear()
        self._keys.clear()
        self._queues = {}
        self._sole = None
        self._deferred = self._new_ready()
        self.limits.clear()
        self._paused = set()
        self.limits.paused = self._paused
        self._scheduled.clear()
        self._deadlines = []
        self._terminal = Fifo()
        self._retained = 0
        self._stale = 0
        self._active.clear()
        self._counts = dict.fromkeys(JobState, 0)
        self._next_seq = 0
        self.flows.clear()

    def export(self) -> list[tuple[Any, ...]]:
        """Every job as the fields of :meth:`restore`, in an order it can rebuild from.

        Non-terminal jobs first, then terminal ones in the order they finished
        (so the retention order survives a checkpoint).
        """
        rows = [_row(e) for e in self._jobs.values() if not e.state.terminal]
        rows.extend(_row(item[1]) for item in self._terminal if item[1].slot == item[2])
        return rows

    def restore(
        self,
        job_id: str,
        task: str,
        payload: dict[str, Any],
        state: str,
        priority: int,
        key: str | None,
        max_attempts: int,
        run_at: float,
        created_at: float,
        seq: int,
        attempts: int,
        epoch: int,
        finished_at: float | None,
        result: Any,
        error: str | None,
        errors: Sequence[Sequence[Any]] = (),
        snoozes: int = 0,
        queue: str = DEFAULT_QUEUE,
        tenant: str | None = None,
        limits: Sequence[str] = (),
        after: Sequence[str] = (),
        deadline: float | None = None,
        cancelled_by: str | None = None,
    ) -> None:
        """Insert a job exactly as a checkpoint recorded it, in any state.

        ``errors`` and ``snoozes`` default to none: a checkpoint of log format
        2 has neither. A job with parents (``after``) is filed under each of
        them; once every row is in, :meth:`restored` counts what the waiting
        ones still wait for.
        """
        if job_id in self._jobs:
            raise InvalidJob(f"job id {job_id!r} is already in use", field="id")
        job_state = JobState(state)
        self._next_seq = max(self._next_seq, seq + 1)
        # As it was kept, even past today's limits (a log an older trioq wrote).
        packed = b"" if not payload else _pack(payload, "payload")
        entry = Entry(job_id, task, packed, job_state, priority, key, max_attempts, run_at, created_at, seq)
        entry.attempts = attempts
        entry.epoch = epoch
        entry.finished_at = finished_at
        # A checkpoint's row holds a non-scalar result packed already.
        entry.result = result if type(result) is bytes or type(result) in _KEPT_AS_IS else _kept(result)
        entry.error = error
        entry.errors = tuple((e[0], e[1], e[2], e[3]) for e in errors)
        entry.snoozes = snoozes
        entry.queue = queue
        entry.tenant = tenant
        entry.deadline = deadline
        if deadline is not None and _expirable(entry, deadline):
            heapq.heappush(self._deadlines, (deadline, seq, entry))
        if limits:
            entry.limits = tuple(limits)
            self.limits.used = True
        if after:
            entry.after = tuple(after)
            entry.cancelled_by = cancelled_by
            self.flows.link(entry, every=True)  # its parents may come later in the checkpoint
        self._jobs[job_id] = entry
        if key is not None:
            self._keys[key] = job_id
        self._counts[job_state] += 1
        if job_state.terminal:
            self._retain(entry)
        elif job_state is _RUNNING:
            self._active[job_id] = entry
            if entry.limits:
                self.limits.hold(entry, None)  # its token was taken before the checkpoint
        else:
            self._push(entry)

    def restored(self) -> None:
        """After the last row of a checkpoint: count each waiting job's unmet parents, and drop the
        flow index's lists of parents that are gone or succeeded."""
        if not self._children:
            return
        flows = self.flows
        flows.prune()
        for kids in self._children.values():
            for child in kids:
                if child.state is _WAITING:
                    child.unmet = flows.unmet(child.after)

    def jobs(self, states: Collection[JobState], limit: int) -> list[Job]:
        """Snapshots of up to ``limit`` jobs in ``states``, oldest enqueued first (a scan: for checks)."""
        wanted = frozenset(states)
        matching = (entry for entry in self._jobs.values() if entry.state in wanted)
        return [entry.snapshot() for entry in heapq.nsmallest(limit, matching, key=lambda entry: entry.seq)]

    def unfinished_by_queue(self) -> dict[str, dict[str, int]]:
        """How many unfinished jobs each named queue holds, per state (``{queue: {state value: n}}``, only
        the states it has): one pass over the table, for an overview."""
        counts: dict[str, dict[str, int]] = {}
        for entry in self._jobs.values():
            state = entry.state
            if not state.terminal:
                per_state = counts.setdefault(entry.queue, {})
                per_state[state.value] = per_state.get(state.value, 0) + 1
        return counts

    def list_jobs(
        self,
        states: Collection[JobState],
        task: str | None,
        queue: str | None,
        tenant: str | None,
        limit: int,
        after_id: str | None,
    ) -> list[Job]:
        """Snapshots of up to ``limit`` jobs in ``states`` (empty: any) with this ``task``, ``queue`` and
        ``tenant`` (``None``: any), newest enqueued first, enqueued before ``after_id`` if given (see
        :meth:`Store.list_jobs <trioq.stores.Store.list_jobs>`). For listings, not hot paths.

        Jobs are walked newest first in the order the table holds them, which is enqueue order
        (adds, replays and checkpoints insert in it), stopping once the page is full: a page costs the
        jobs enqueued after its last one. Should that order ever not hold, the walk notices (a ``seq``
        out of order) and scans every job instead."""
        before = math.inf
        if after_id is not None:
            cursor = self._jobs.get(after_id)
            if cursor is None:
                raise InvalidJob(
                    f"after_id {after_id!r:.80} names no job this store holds (evicted since?): list from the"
                    " first page again",
                    field="after_id",
                )
            before = cursor.seq
        wanted = frozenset(states)

        def takes(entry: Entry) -> bool:
            return (
                entry.seq < before
                and (not wanted or entry.state in wanted)
                and (task is None or entry.task == task)
                and (queue is None or entry.queue == queue)
                and (tenant is None or entry.tenant == tenant)
            )

        page: list[Entry] = []
        last = math.inf
        for entry in reversed(self._jobs.values()):
            if entry.seq >= last:  # not in enqueue order after all: scan them all
                matching = (entry for entry in self._jobs.values() if takes(entry))
                page = heapq.nlargest(limit, matching, key=lambda entry: entry.seq)
                break
            last = entry.seq
            if len(page) == limit:
                break
            if takes(entry):
                page.append(entry)
        return [entry.snapshot() for entry in page]

    def running(self) -> list[Entry]:
        """Every running entry (recovery releases these)."""
        return list(self._active.values())

    # ---------------------------------------------------------------- helpers

    def _admit(self, entry: Entry, now: float) -> bool:
        """Whether ``entry`` (just popped from its ready queue) may start now; if not, it is parked
        (see .limits) and, for a rate, the store hears when it will be due."""
        limits = self.limits
        due = limits.admit(entry, now)
        if due is None:
            return True
        if due != math.inf and self.on_throttled is not None:
            self.on_throttled(due)
        self._let_go(limits.drain())  # the slot it was let go for, passed on
        return False

    def _let_go(self, entries: list[Entry]) -> None:
        """Put jobs passed over for a limit back in their ready queues, and say so."""
        if not entries:
            return
        for entry in entries:
            self._push(entry)
        if self.on_unblocked is not None:
            self.on_unblocked(len(entries))

    def _unthrottle(self, now: float) -> None:
        """Put back the jobs passed over for a rate whose token is due at ``now``."""
        self._let_go(self.limits.due(now))

    def next_due(self) -> float | None:
        """When something is due next: a scheduled job's ``run_at``, a deadline, or a rate's token for a
        job passed over (``None``: nothing)."""
        times = [t for t in (self.next_run_at(), self.next_deadline(), self.limits.next_due()) if t is not None]
        return min(times) if times else None

    def set_fairness(self, weights: Mapping[str, float] | None) -> None:
        """Order each named queue's ready jobs, and the admission of deferred jobs, fairly across
        tenants by ``weights`` (see :class:`~.fair.FairReadyQueue`), or by plain priority and FIFO
        (``None``; deferred jobs: oldest first); the jobs waiting now are moved over. Fairness
        tags start level: they are not kept across sessions or restarts."""
        if weights is None:
            self._new_ready = ReadyQueue
        else:
            frozen = dict(weights)
            self._new_ready = lambda: FairReadyQueue(frozen)
        self._queues = {name: _current_ready(ready, self._new_ready()) for name, ready in self._queues.items()}
        self._deferred = _current_ready(self._deferred, self._new_ready(), lane=0)
        self._choose()

    def _choose(self) -> None:
        """Keep :attr:`_sole` right after the ready queues or the pauses changed."""
        only = len(self._queues) == 1 and not self._paused
        self._sole = next(iter(self._queues.values())) if only else None

    def _best(self, queues: Collection[str] | None) -> AnyReady | None:
        """The ready queue, among ``queues`` (all: ``None``) not paused, whose first job is the best;
        ``None`` when none holds a ready job. Stale items at the heads are dropped on the way."""
        best: AnyReady | None = None
        best_key: tuple[int, float, int] | None = None
        paused = self._paused
        empty: list[str] = []
        for name in self._queues if queues is None else queues:
            ready = self._queues.get(name)
            if ready is None or name in paused:
                continue
            while (item := ready.first()) is not None and item[2].slot != item[3]:
                ready.pop()
            if item is None:
                empty.append(name)
                continue
            key = (-item[2].priority, item[0], item[1])
            if best_key is None or key < best_key:
                best, best_key = ready, key
        if empty:  # a queue name used once must not cost every later claim a look
            for name in empty:
                del self._queues[name]
            self._choose()
        return best

    def _running(self, job_id: str, epoch: int) -> Entry | None:
        # An unknown id is stale too: the job may have been cancelled and
        # evicted while the attempt that names it was still running.
        try:
            entry = self._active.get(job_id)
        except TypeError:  # an unhashable id names no job
            return None
        if entry is None or entry.epoch != epoch:
            return None
        return entry

    def _move(self, entry: Entry, state: JobState) -> None:
        counts = self._counts
        counts[entry.state] -= 1
        counts[state] += 1
        if entry.state is _RUNNING:
            del self._active[entry.id]
            if entry.limits:
                entry.state = state
                self.limits.unhold(entry)
                self._let_go(self.limits.drain())
        elif state is _RUNNING:
            self._active[entry.id] = entry
        elif entry.waking is not None:  # let go for a slot, and leaving without taking it
            entry.state = state
            self.limits.left(entry)
            self._let_go(self.limits.drain())
        entry.state = state

    def _finish(self, entry: Entry, state: JobState, now: float) -> None:
        children = self._children.get(entry.id) if self._children else None
        self._end(entry, state, now)
        if children:
            self._flow(entry, children, now)

    def _flow(self, parent: Entry, children: list[Entry], now: float) -> None:
        """Move the waiting children of ``parent``, which just ended: a success counts for each (the
        last one makes it ready, or scheduled); a death or cancel cancels them, and theirs, down
        the flow (see .flows)."""
        if parent.state is _SUCCEEDED:
            self._children.pop(parent.id, None)
            ready = 0
            for child in children:
                if child.state is not _WAITING:
                    continue
                child.unmet -= 1
                if child.unmet:
                    continue
                self._admit_one(child, now)  # never deferred: like a retry, it was enqueued already
                if child.state is _READY:
                    ready += 1
                elif self.on_throttled is not None:
                    self.on_throttled(child.run_at)
            if ready and self.on_unblocked is not None:
                self.on_unblocked(ready)
            return
        # Breadth first: a job is cancelled in the name of the nearest parent that ended (the first
        # one, in enqueue order, of those at that distance).
        stack = collections.deque([(parent, children)])
        while stack:
            ended, kids = stack.popleft()
            for child in kids:
                if child.state is not _WAITING:
                    continue
                grandchildren = self._children.get(child.id)
                child.error = parent_failed(ended.id, ended.state)
                child.cancelled_by = ended.id
                self._end(child, _CANCELLED, now)
                if grandchildren:
                    stack.append((child, grandchildren))

    def _end(self, entry: Entry, state: JobState, now: float) -> None:
        self._move(entry, state)
        entry.finished_at = now
        self._retain(entry)
        if entry.id in self.watched:
            self.on_finish(entry.snapshot())
        # The count bound holds at every moment, not just after evict(); being
        # part of the transition, replay reproduces it without a record.
        # Unrolled _oldest/_evict_oldest/_forget: past the bound this runs
        # once per finished job, on entries long out of the CPU caches.
        terminal = self._terminal
        while self._retained > self.max_retained:
            pos = terminal.pos
            if pos < len(terminal.head):
                item = terminal.head[pos]
            else:
                first = terminal.first()
                assert first is not None  # _retained counts the current items
                item, pos = first, 0
            terminal.pos = pos + 1
            oldest = item[1]
            if oldest.slot != item[2]:
                continue  # stale: retried or dropped since
            self._forget(oldest)
            if self.on_overflow_drop is not None:
                self.on_overflow_drop(oldest.id)

    def _retain(self, entry: Entry) -> None:
        assert entry.finished_at is not None
        entry.slot = token = entry.slot + 1
        self._terminal.append((entry.finished_at, entry, token))
        self._retained += 1

    def _push(self, entry: Entry) -> None:
        entry.slot = token = entry.slot + 1
        if entry.state is _WAITING:
            return  # in no queue: its last parent's success moves it (see _flow)
        if entry.state is _DEFERRED:
            deferred = self._deferred
            deferred.push(0, (0.0, entry.seq, entry, token))
            if deferred.size > 2 * self._counts[_DEFERRED] + CHUNK:
                self._deferred = _current_ready(deferred, self._new_ready(), lane=0)
        elif entry.state is _READY:
            queues = self._queues
            ready = queues.get(entry.queue)
            if ready is None:
                ready = queues[entry.queue] = self._new_ready()
                self._choose()
            ready.push(entry.priority, (entry.run_at, entry.seq, entry, token))
            if ready.size > 2 * self._counts[_READY] + CHUNK:
                queues[entry.queue] = _current_ready(ready, self._new_ready())
                self._choose()
        else:
            heap = self._scheduled
            heapq.heappush(heap, (entry.run_at, entry.seq, entry, token))
            if len(heap) > 2 * self._counts[_SCHEDULED] + CHUNK:
                self._scheduled = [item for item in heap if item[2].slot == item[3]]
                heapq.heapify(self._scheduled)


def _expirable(entry: Entry, deadline: float) -> bool:
    """Whether ``entry`` is a never-claimed ready, scheduled, deferred or waiting job whose deadline is ``deadline``."""
    state = entry.state
    return (
        entry.deadline == deadline
        and entry.epoch == 0
        and (state is _READY or state is _SCHEDULED or state is _DEFERRED or state is _WAITING)
    )


def _ignore(job: Job) -> None:
    """The default :attr:`JobTable.on_finish`: nobody watches."""


def _current_ready(ready: AnyReady, fresh: AnyReady, *, lane: int | None = None) -> AnyReady:
    """``ready`` without its stale items.

    Cancelled, evicted or requeued jobs leave their queue items behind (lazy
    deletion); claims skip them, but with nothing claiming (a producer-only
    queue, jobs scheduled far ahead) they would pile up. Both queues are
    rebuilt once they hold more than twice their current jobs (plus a
    :data:`CHUNK`), which keeps the work O(1) per push, amortised. The items
    go to ``fresh`` (an empty queue of the kind the table makes), each in its
    job's priority lane, or all in ``lane`` (the deferred jobs' queue: lane 0).
    """
    for item in ready:
        entry: Entry = item[2]
        if entry.slot == item[3]:
            fresh.push(entry.priority if lane is None else lane, item)
    return fresh


_encode = msgspec.msgpack.Encoder().encode
_EMPTY_MAP = _encode({})
_decode = msgspec.msgpack.Decoder().decode


def pack_payload(payload: dict[str, Any], *, field: str = "payload") -> bytes:
    """``payload`` as the msgpack bytes an entry keeps (``b""`` when empty).

    Raises :class:`~trioq.InvalidJob` naming ``field`` for values JSON allows
    but msgpack cannot hold (ints beyond 64 bits, strings with lone
    surrogates), and for more than :data:`~trioq._model.MAX_VALUE_BYTES`
    packed: stores call this for a whole batch before changing anything.
    """
    if type(payload) is dict and not payload:  # exactly: a dict subclass may say it is empty and not be
        return b""
    check_json(payload, what=field)
    packed = _pack(payload, field)
    if len(packed) > MAX_VALUE_BYTES:
        raise InvalidJob(_too_large(field, len(packed)), field=field)
    return packed


def _pack(value: Any, field: str) -> bytes:
    """``value`` as msgpack, or :class:`~trioq.InvalidJob` naming ``field`` for what msgpack cannot hold."""
    try:
        return _encode(value)
    except (OverflowError, UnicodeEncodeError, TypeError, ValueError, RecursionError) as exc:
        raise InvalidJob(f"{field} cannot be stored: {exc}", field=field) from None


def _too_large(field: str, size: int) -> str:
    return (
        f"{field} cannot be stored: it is {size} bytes as msgpack, and a store holds at most "
        f"{MAX_VALUE_BYTES} (256 MiB); keep large data elsewhere and pass a reference to it"
    )


#: Results an entry keeps as they are: immutable, and msgpack holds them.
_KEPT_AS_IS = frozenset({type(None), bool, float})


def stored_result(result: Any) -> Any:
    """The form in which an entry keeps a job's result.

    ``None``, bools, floats, 64-bit ints and strings are kept as they are
    (immutable); anything else as msgpack bytes, which every snapshot decodes
    into its own copy, so neither the handler (still holding what it
    returned) nor a caller (mutating ``job.result``) can change what the
    table and its log say. Results are JSON values, never bytes, so bytes
    here always mean packed. Raises :class:`~trioq.InvalidJob` for what
    msgpack cannot hold (ints beyond 64 bits, strings with lone surrogates),
    and for more than :data:`~trioq._model.MAX_VALUE_BYTES` packed.
    """
    kind = type(result)
    if kind in _KEPT_AS_IS:
        if kind is float and not math.isfinite(result):
            raise InvalidJob(f"result must be a JSON value: result is {result}, which JSON cannot hold", field="result")
        return result
    if kind is int:
        if INT_MIN <= result <= INT_MAX:
            return result
        return _pack(result, "result")  # raises
    if kind is str:
        try:
            size = len(result) if result.isascii() else len(result.encode())
        except UnicodeEncodeError as exc:
            raise InvalidJob(f"result cannot be stored: {exc}", field="result") from None
        if size > MAX_VALUE_BYTES:
            raise InvalidJob(_too_large("result", size), field="result")
        return result
    if kind is bytes:
        raise InvalidJob("result cannot be stored: bytes are not a JSON value", field="result")
    check_json(result, what="result")
    packed = _pack(result, "result")
    if len(packed) > MAX_VALUE_BYTES:
        raise InvalidJob(_too_large("result", len(packed)), field="result")
    return packed


def _kept(result: Any) -> Any:
    """A result read back from a checkpoint, kept as :func:`stored_result` would, without its limits."""
    if (type(result) is int and INT_MIN <= result <= INT_MAX) or type(result) is str:
        return result
    return _pack(result, "result")


def log_result(stored: Any) -> Any:
    """A stored result as a log record embeds it (packed bytes go in unencoded)."""
    return msgspec.Raw(stored) if type(stored) is bytes else stored


def raw_payload(packed: bytes) -> msgspec.Raw:
    """Packed payload bytes to embed, unencoded, in a log record (as ADD records carry them)."""
    return msgspec.Raw(packed or _EMPTY_MAP)


def _unpack(blob: bytes) -> dict[str, Any]:
    """A fresh payload dict from :func:`pack_payload`'s bytes."""
    return _decode(blob) if blob else {}


def _row(e: Entry) -> tuple[Any, ...]:
    """An entry as the fields of :meth:`JobTable.restore` (and of a WAL ENTRY record).

    A non-scalar result stays in its stored form, msgpack bytes (see
    :func:`stored_result`), which :meth:`JobTable.restore` takes back as is.
    Then :func:`trailing_fields`.
    """
    row = (
        e.id, e.task, _unpack(e.packed_payload), e.state.value, e.priority, e.key, e.max_attempts, e.run_at,
        e.created_at, e.seq, e.attempts, e.epoch, e.finished_at, e.result, e.error, e.errors, e.snoozes,
    )  # fmt: skip
    return (*row, *trailing_fields(e))


def trailing_fields(e: Entry, *, add: bool = False) -> tuple[Any, ...]:
    """The fields a WAL ADD and ENTRY record end with, ``queue, tenant, limits, after, deadline``, as far as
    the last one not at its default (``()`` for a job of the default queue with none of them): a field
    added and not used costs the log nothing. With ``add``, a deferred job's ADD goes on to ``metadata,
    deferred`` (``None, True``); ENTRY has no such field, its state says it. Without ``add``, a job
    cancelled because of a parent goes on to ``metadata, cancelled_by`` (ENTRY's own field; replay of
    an ADD derives it)."""
    if add and e.state is _DEFERRED:
        return (e.queue, e.tenant, e.limits, e.after, e.deadline, None, True)
    if not add and e.cancelled_by is not None:
        return (e.queue, e.tenant, e.limits, e.after, e.deadline, None, e.cancelled_by)
    if e.deadline is not None:
        return (e.queue, e.tenant, e.limits, e.after, e.deadline)
    if e.after:
        return (e.queue, e.tenant, e.limits, e.after)
    if e.limits:
        return (e.queue, e.tenant, e.limits)
    if e.tenant is not None:
        return (e.queue, e.tenant)
    if e.queue != DEFAULT_QUEUE:
        return (e.queue,)
    return ()
