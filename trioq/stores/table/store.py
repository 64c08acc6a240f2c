"""TableStore: the Store protocol over one in-process JobTable.

Every method applies a transition of the pure table, then hands the record of
that transition to :meth:`TableStore._record` in the same synchronous step
(so records reach the log in the order the table applied them), then awaits
:meth:`TableStore._flush` before answering; except ``claim`` and
``complete``, whose records are ``lazy`` (nobody waits for them: the log
commits them with the next batch, and whoever reports an outcome syncs). ``MemoryStore`` records nothing;
``WALStore`` appends each record to its log and ``_flush`` returns once the
record is written (and, with ``fsync="always"``, on disk). Recovery replays
those records through the same table methods.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

import trio

from ..._model import (
    DEFAULT_QUEUE,
    INT64_MAX,
    INT_MIN,
    InvalidJob,
    Job,
    JobState,
    QueueFull,
    error_text,
    name_problem,
    storable_text,
)
from ..._validate import label, number
from ..._validate import where as _where
from .._base import (
    Added,
    CancelResult,
    ClaimRequest,
    Failed,
    IdMaker,
    JobFilter,
    NewJob,
    Outcome,
    Released,
    Snoozed,
    StoreConfig,
    Succeeded,
    key_clash,
)
from .cron import CronTicks
from .jobs import Entry, JobTable, log_result, pack_payload, raw_payload, trailing_fields

__all__ = [
    "ADD",
    "ADMIT",
    "CANCEL",
    "CLAIM",
    "DROP",
    "EXPIRE",
    "FAIL",
    "PAUSE",
    "RELEASE",
    "RESUME",
    "RETRY",
    "SNOOZE",
    "SUCCEED",
    "TableStore",
]

# Transition record types, shared with the WAL format; each record's fields,
# in the order of the tuples handed to _record, are its struct's in
# stores/wal/_records.py (9 to 11 are the WAL's checkpoint records).
ADD, CLAIM, SUCCEED, FAIL, RELEASE, CANCEL, RETRY, DROP = 1, 2, 3, 4, 5, 6, 7, 8
SNOOZE, EXPIRE, PAUSE, RESUME, ADMIT = 12, 13, 14, 15, 16


def _checked(job: NewJob, where: str) -> NewJob:
    """``job`` with every field one the store (and its log) can hold, else :class:`~trioq.InvalidJob`.

    The fields come back of exactly the builtin types (a ``str`` or ``int``
    subclass, such as ``numpy.str_``, as a plain copy): the log's encoder takes
    no subclass, and the table keeps what it is given. Names are checked by
    :func:`~trioq._model.name_problem`; ints must fit 64 bits.
    """
    task, key, priority, max_attempts, delay = job.task, job.key, job.priority, job.max_attempts, job.delay
    if job.queue != DEFAULT_QUEUE or job.tenant is not None or job.deadline is not None or job.limits:
        job = _checked_labels(job, where)
    exact = (
        type(task) is str
        and (key is None or type(key) is str)
        and type(priority) is int
        and type(max_attempts) is int
        and type(delay) is float
        and 0.0 <= delay < math.inf
    )
    if not exact:
        task = _plain_str(task, f"{where}task")
        key = None if key is None else _plain_str(key, f"{where}key")
        priority = _plain_int(priority, f"{where}priority")
        max_attempts = _plain_int(max_attempts, f"{where}max_attempts")
        delay = number(f"{where}delay", delay)
        job = NewJob(
            task, job.payload, priority, key, max_attempts, delay, job.queue, job.tenant, job.deadline, job.limits,
            job.after,
        )  # fmt: skip
    if not (INT_MIN <= priority <= INT64_MAX and 1 <= max_attempts <= INT64_MAX):
        field = f"{where}priority" if not INT_MIN <= priority <= INT64_MAX else f"{where}max_attempts"
        raise InvalidJob(
            f"{field} cannot be stored: it must be a signed 64-bit integer (max_attempts >= 1)", field=field
        )
    for field, value in (("task", task), ("key", key)):
        if value is not None and (problem := name_problem(value)) is not None:
            shown = repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
            raise InvalidJob(f"{where}{field} {shown} cannot be stored: {problem}", field=f"{where}{field}")
    return job


def _checked_labels(job: NewJob, where: str) -> NewJob:
    """``job`` with a storable ``queue`` and ``tenant`` (plain strings), a ``deadline`` that is a
    finite number of seconds >= 0, and ``limits`` a tuple of storable keys (plain strings, none
    twice), else :class:`~trioq.InvalidJob` naming the field."""
    queue = label(f"{where}queue", job.queue)
    tenant = None if job.tenant is None else label(f"{where}tenant", job.tenant)
    deadline = job.deadline
    if deadline is not None:
        deadline = number(f"{where}deadline", deadline)
    limits = job.limits
    if limits:
        if not isinstance(limits, tuple) or len(set(limits)) != len(limits):
            raise InvalidJob(
                f"{where}limits must be a tuple of distinct keys, got {limits!r:.60}", field=f"{where}limits"
            )
        for key in limits:
            problem = name_problem(key) if isinstance(key, str) and key else "it is not a non-empty string"
            if problem is not None:
                raise InvalidJob(f"{where}limits: key {key!r:.60} cannot be stored: {problem}", field=f"{where}limits")
        limits = tuple(str.__str__(key) for key in limits)
    return NewJob(
        job.task, job.payload, job.priority, job.key, job.max_attempts, job.delay, queue, tenant, deadline, limits,
        job.after,
    )  # fmt: skip


def _waits(table: JobTable, jobs: Sequence[NewJob], index: int) -> bool:
    """Whether ``jobs[index]`` (its parents named by id all in ``table``) will be added waiting or
    cancelled, so not pending: a parent that has not succeeded, the new job of an earlier spec, or the
    unsucceeded job an earlier spec's idempotency key stands for."""
    for parent in jobs[index].after:
        if type(parent) is int:
            if not 0 <= parent < index:
                return True  # no earlier spec: _parents refuses it
            key = jobs[parent].key
            held = table.by_key(key) if key is not None else None
            if held is None or held.state is not _SUCCEEDED:
                return True
        elif isinstance(parent, str) and table.flows.unmet((parent,)):
            return True
    return False


def _check_keys(table: JobTable, jobs: Sequence[NewJob]) -> None:
    """Raise :func:`key_clash` (before anything is inserted) for a job whose idempotency key a job of
    another task holds, in the table or earlier in the same batch."""
    seen: dict[str, str] = {}
    for i, j in enumerate(jobs):
        key = j.key
        if key is None or type(key) is not str:  # _checked refuses a bad key later
            continue
        holder = table.by_key(key)
        task = seen.setdefault(key, j.task) if holder is None else holder.task
        if task != j.task:
            raise key_clash(key, task, j.task, _where(i if len(jobs) > 1 else None))


def _parents(job: NewJob, index: int, ids: Sequence[str], where: str) -> tuple[str, ...]:
    """``job.after`` as job ids, each once, in order: an ``int`` names the job at that index of the
    batch (``ids``, those before ``index``); else :class:`~trioq.InvalidJob` (``field`` ``after``)."""
    out: list[str] = []
    for parent in job.after:
        if type(parent) is int:
            if not 0 <= parent < index:
                raise InvalidJob(
                    f"{where}after: {parent} names no earlier job of this batch (an int in after must be "
                    f"from 0 to {index - 1})"
                    if index
                    else f"{where}after: {parent} names no earlier job of this batch (this is its first job)",
                    field=f"{where}after",
                )
            parent_id = ids[parent]
        elif isinstance(parent, str) and parent:
            parent_id = str.__str__(parent)
        else:
            raise InvalidJob(
                f"{where}after must hold job ids (strings) or ints naming earlier jobs of the batch, "
                f"got {parent!r:.60}",
                field=f"{where}after",
            )
        if parent_id not in out:
            out.append(parent_id)
    return tuple(out)


def _plain_str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidJob(f"{field} must be a string, got {type(value).__name__}", field=field)
    return str.__str__(value)


def _plain_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(f"{field} must be an integer, got {type(value).__name__}", field=field)
    return int.__index__(value)


_READY, _SCHEDULED, _SUCCEEDED = JobState.READY, JobState.SCHEDULED, JobState.SUCCEEDED


def _delay(seconds: float) -> float:
    """An outcome's delay as a plain float; a negative one is none. The runtime makes these: anything
    but a finite number is its bug, a ``ValueError`` (the batch's outcomes before it stay applied)."""
    return max(number("an outcome's delay", seconds, minimum=-math.inf, error=ValueError), 0.0)


class TableStore(CronTicks):
    """Shared body of the in-process stores; subclasses provide ``session``."""

    #: Outcomes are applied in this process: the runtime completes each attempt inline.
    batch_outcomes = False

    #: Whether :meth:`_record` does anything (the two hottest calls skip
    #: building records for a store that keeps no log).
    logs = True

    def __init__(self) -> None:
        super().__init__()  # CronTicks: the cron schedules' last ticks
        self._table: JobTable | None = None
        self._config: StoreConfig | None = None
        self._ids = IdMaker()

    # Hooks ---------------------------------------------------------------

    def _record(self, kind: int, fields: tuple[Any, ...], *, lazy: bool = False) -> int:
        """Log one applied transition (synchronously; no await between apply and this); returns
        its sequence number (0 for a store that keeps no log), which the job's entry keeps.

        ``lazy``: nobody waits for this record yet (a claim, a success the
        worker does not wait for); the log may hold it back for a while, to
        commit it with others (see ``LogWriter.append``).
        """
        return 0

    async def _durable(self, upto: int | None) -> None:
        """Until the records up to sequence number ``upto`` (``None``: every record so far) are as
        durable as the store promises; cancellable (it only waits). The base keeps no log: a
        schedule point, and nothing for a cancel to cut short."""
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def _flush(self) -> None:
        """Until every record so far is as durable as the store promises.

        Not a cancel point (see the :class:`~trioq.stores.Store` docstring):
        transitions await it after applying themselves.
        """

    # Helpers -------------------------------------------------------------

    def _attach(self, table: JobTable, config: StoreConfig) -> None:
        """Serve the session of ``config`` from ``table`` (its watched jobs' outcomes included)."""
        table.watched = config.watched
        table.on_finish = config.on_finished
        table.on_expire = self._expired
        table.on_admit = self._admitted
        table.limits.limit_of = config.limits
        table.on_unblocked = config.on_ready
        table.on_throttled = config.on_scheduled
        table.set_fairness(config.fairness)
        # No bound: admit everything (jobs deferred under an earlier session's bound must not stay so).
        table.defer_past = config.defer_past if config.defer_past is not None else math.inf
        self._table, self._config = table, config

    def _open(self) -> tuple[JobTable, StoreConfig]:
        table, config = self._table, self._config
        if table is None or config is None:
            raise RuntimeError(f"{type(self).__name__} is not open; use it through trioq.open_queue")
        return table, config

    def _expired(self, entry: Entry) -> None:
        """Log a job the table cancelled for its deadline (nobody waits for the record)."""
        entry.logged = self._record(EXPIRE, (entry.id, entry.finished_at), lazy=True)

    def _admit_at_open(self) -> None:
        """Admit the deferred jobs the bound has room for as a session opens (room made while no
        session ran, or a larger bound); the store's log must be open."""
        table, config = self._open()
        table.admit_due(config.clock())

    def _admitted(self, entry: Entry, now: float) -> None:
        """Log a deferred job the table admitted at ``now`` (its record rides with the transition's)."""
        entry.logged = self._record(ADMIT, (entry.id, now), lazy=True)

    def _announce(self, entry: Entry) -> None:
        assert self._config is not None
        if entry.state is JobState.READY:
            self._config.on_ready(1)
        elif entry.state is JobState.SCHEDULED:
            self._config.on_scheduled(entry.run_at)

    def _release_running(self) -> None:
        """Put every running job back to ready, uncounted (session end, recovery).

        Stores call this when no attempt of theirs can still be running it.
        """
        table, _ = self._open()
        for entry in table.running():
            epoch = entry.epoch
            table.release(entry.id, epoch)
            entry.logged = self._record(RELEASE, (entry.id, epoch))

    # The Store protocol --------------------------------------------------

    async def add(self, jobs: Sequence[NewJob], *, max_pending: int | None = None) -> Added:
        table, config = self._open()
        now = config.clock()
        _check_keys(table, jobs)
        flows = any(j.after for j in jobs)
        if flows:  # every parent named by id must be here before any job goes in
            for i, j in enumerate(jobs):
                named = tuple(p for p in j.after if type(p) is not int and isinstance(p, str))
                table.flows.check(named, f"{_where(i if len(jobs) > 1 else None)}after")
        if max_pending is not None:
            # Jobs that will wait for a parent are not pending (nor counted against the bound).
            counted = [j for i, j in enumerate(jobs) if not j.after or not _waits(table, jobs, i)] if flows else jobs
            new_keys = {j.key for j in counted if j.key is not None and not table.holds_key(j.key)}
            fresh = len(new_keys) + sum(1 for j in counted if j.key is None)
            if fresh and table.pending + fresh > max_pending:
                raise QueueFull(
                    f"queue is full: {table.pending} jobs waiting, max_ready={max_pending}; retry later",
                    retry_after=1.0,
                )
        # Check every field and encode every payload before the table
        # changes: all or nothing, and no record the log cannot encode.
        if len(jobs) == 1:
            jobs = [_checked(jobs[0], "")]
            packed = [pack_payload(jobs[0].payload)]
        else:
            checked, packed = [], []
            for i, j in enumerate(jobs):
                checked.append(_checked(j, f"jobs[{i}]."))
                packed.append(pack_payload(j.payload, field=f"jobs[{i}].payload"))
            jobs = checked
        out = Added()
        found: list[int] = []
        ready = 0
        scheduled: list[float] = []
        record = self._record
        logs = self.logs
        ids: list[str] = []
        for i, (j, blob) in enumerate(zip(jobs, packed, strict=True)):
            job_id = self._ids()
            run_at = now + j.delay
            queue, tenant = j.queue, j.tenant
            deadline = None if j.deadline is None else now + j.deadline
            if flows:
                after = _parents(j, i, ids, _where(i if len(jobs) > 1 else None)) if j.after else ()
                existing = table.add_packed(
                    job_id, j.task, blob, j.priority, j.key, j.max_attempts, run_at, now, queue, tenant, deadline,
                    j.limits, None, after,
                )  # fmt: skip
                ids.append(job_id if existing is None else existing)
            else:
                existing = table.add_packed(
                    job_id, j.task, blob, j.priority, j.key, j.max_attempts, run_at, now, queue, tenant, deadline,
                    j.limits,
                )  # fmt: skip
            if existing is not None:
                out.append(table.get(existing))
                found.append(i)
                continue
            entry = table.entry(job_id)
            if logs:
                fields: tuple[Any, ...] = (
                    job_id, j.task, raw_payload(blob), j.priority, j.key, j.max_attempts, run_at, now,
                )  # fmt: skip
                if (
                    deadline is not None
                    or j.limits
                    or tenant is not None
                    or queue != DEFAULT_QUEUE
                    or entry.state is JobState.DEFERRED
                    or entry.after
                ):
                    fields = (*fields, *trailing_fields(entry, add=True))
                entry.logged = record(ADD, fields)
            job = entry.snapshot(j.payload)
            if job.state is JobState.READY:
                ready += 1
            elif job.state is JobState.SCHEDULED:
                scheduled.append(job.run_at)
            if deadline is not None:
                scheduled.append(deadline)  # the timer wakes then to cancel it, if it has not started
            out.append(job)
        # Workers hear of the jobs now, not once they are durable (busy ones
        # could claim them anyway): an idle worker starts a job a whole fsync
        # sooner. Nothing acknowledged depends on it: a job that runs and is
        # then lost to a crash was never acknowledged, so its producer may
        # submit it again, as with any at-least-once queue.
        for run_at in scheduled:
            config.on_scheduled(run_at)
        if ready:
            config.on_ready(ready)
        await self._flush()
        out.existing = frozenset(found)
        return out

    async def claim(self, request: ClaimRequest) -> list[Job]:
        table, config = self._open()
        limit = request.limit
        queues = request.queues
        if limit == 1:  # the hot path: one free worker asks
            # The time matters only for promoting scheduled jobs and for deadlines.
            now = config.clock() if table.needs_clock else 0.0
            entry = table.claim_next(now, queues)
            if entry is None:
                return []
            if self.logs:
                # A job holding limit keys: the claim's time rebuilds the rates' state on replay.
                fields = (entry.id, now) if entry.limits else (entry.id,)
                entry.logged = self._record(CLAIM, fields, lazy=True)
            return [entry.snapshot()]  # not flushed: see Store.claim
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"ClaimRequest.limit must be an int >= 0, got {limit!r}")
        claimed: list[Job] = []
        now = config.clock() if table.needs_clock else 0.0
        while len(claimed) < limit and (entry := table.claim_next(now, queues)) is not None:
            if self.logs:
                fields = (entry.id, now) if entry.limits else (entry.id,)
                entry.logged = self._record(CLAIM, fields, lazy=True)
            claimed.append(entry.snapshot())
        return claimed

    async def extend(self, node: str, held: Sequence[tuple[str, int]], lease: float) -> list[bool]:
        table, _ = self._open()
        return [table.holds(job_id, epoch) for job_id, epoch in held]

    async def complete(self, outcomes: Sequence[Outcome]) -> list[JobState | None]:
        table, config = self._open()
        now = config.clock()
        if len(outcomes) == 1 and not self.logs:
            # The hot path: one worker's success, on a store that keeps no log.
            outcome = outcomes[0]
            if type(outcome) is Succeeded:
                try:
                    entry = table.succeed(outcome.job_id, outcome.epoch, outcome.result, now)
                except InvalidJob:
                    pass  # the general path fails it for good
                else:
                    return [None if entry is None else _SUCCEEDED]
        out: list[JobState | None] = []
        for outcome in outcomes:
            entry = self._apply(table, outcome, now)
            if entry is None:
                out.append(None)
                continue
            state = entry.state
            out.append(state)
            if state is _READY:
                config.on_ready(1)
            elif state is _SCHEDULED:
                config.on_scheduled(entry.run_at)
        # Nobody waits for these records: they join the log's next commit. No
        # schedule point either: this is the hottest call of a drain, and the
        # workers take one every few jobs themselves.
        return out

    def _apply(self, table: JobTable, outcome: Outcome, now: float) -> Entry | None:
        """Apply one outcome to the table and log it; the entry, or ``None`` if its epoch is stale."""
        job_id, epoch = outcome.job_id, outcome.epoch
        if type(outcome) is Succeeded:
            try:
                entry = table.succeed(job_id, epoch, outcome.result, now)
            except InvalidJob as exc:  # a result it cannot hold: it will never succeed
                return self._fail(table, job_id, epoch, error_text(exc), None, now, None)
            if entry is not None and self.logs:
                entry.logged = self._record(SUCCEED, (entry.id, entry.epoch, log_result(entry.result), now), lazy=True)
            return entry
        if type(outcome) is Failed:
            retry_in = outcome.retry_in
            retry_at = None if retry_in is None else now + _delay(retry_in)
            return self._fail(table, job_id, epoch, outcome.error, retry_at, now, outcome.traceback)
        if type(outcome) is Released:
            entry = table.release(job_id, epoch)
            if entry is not None:
                entry.logged = self._record(RELEASE, (entry.id, entry.epoch), lazy=True)
            return entry
        if type(outcome) is Snoozed:
            run_at = now + _delay(outcome.delay)
            # Past MAX_SNOOZES the table fails the job instead: a replay of
            # the record does the same.
            entry = table.snooze(job_id, epoch, run_at, now)
            if entry is not None:
                entry.logged = self._record(SNOOZE, (entry.id, entry.epoch, run_at, now), lazy=True)
            return entry
        raise TypeError(f"not a trioq.stores outcome: {type(outcome).__name__}")

    def _fail(
        self,
        table: JobTable,
        job_id: str,
        epoch: int,
        error: str,
        retry_at: float | None,
        now: float,
        traceback: str | None,
    ) -> Entry | None:
        error = storable_text(error)
        if traceback is not None:
            traceback = storable_text(traceback)
        entry = table.fail(job_id, epoch, error, retry_at, now, traceback)
        if entry is not None:
            fields = (entry.id, entry.epoch, error, retry_at, now, traceback)
            entry.logged = self._record(FAIL, fields, lazy=True)
        return entry

    async def rescue(self) -> int:
        self._open()
        await trio.lowlevel.checkpoint()
        return 0  # one node, this runtime: its running jobs are its own (a session's end releases them)

    async def sync(self, job_id: str | None = None) -> None:
        if job_id is None:
            await self._durable(None)
            return
        table, _ = self._open()
        # An evicted job's last record is not known: wait for every record then.
        await self._durable(table.logged(job_id))

    async def results(self, ids: Sequence[str]) -> dict[str, Any]:
        """``{id: result}`` of each of ``ids`` the table holds that succeeded (what ``ctx.parents`` reads)."""
        table, _ = self._open()
        await trio.lowlevel.checkpoint()
        out: dict[str, Any] = {}
        for job_id in ids:
            if job_id in table:
                entry = table.entry(job_id)
                if entry.state is _SUCCEEDED:
                    out[job_id] = entry.result_value()
        return out

    async def get(self, job_id: str) -> Job:
        table, _ = self._open()
        return table.get(job_id)

    async def cancel(self, job_id: str) -> CancelResult:
        table, config = self._open()
        now = config.clock()
        entry, changed, running_epoch = table.cancel(job_id, now)
        if changed:
            entry.logged = self._record(CANCEL, (entry.id, now))
        result = CancelResult(entry.snapshot(), changed)
        if running_epoch is not None:
            config.on_cancel(job_id, running_epoch)
        await self._flush()
        return result

    async def retry(self, job_id: str) -> Job:
        table, config = self._open()
        now = config.clock()
        entry = table.retry(job_id, now)
        entry.logged = self._record(RETRY, (entry.id, now))
        job = entry.snapshot()
        await self._flush()
        self._announce(entry)
        return job

    async def promote(self) -> float | None:
        table, config = self._open()
        promoted = table.promote(config.clock())
        if promoted:
            config.on_ready(promoted)
        return table.next_due()

    async def evict(self) -> int:
        table, config = self._open()
        evicted = table.evict(config.clock())
        for job_id in evicted:
            self._record(DROP, (job_id,))
        await self._flush()
        return len(evicted)

    async def jobs(self, states: Collection[JobState], *, limit: int = 100) -> list[Job]:
        table, _ = self._open()
        return table.jobs(states, limit)

    async def queue_counts(self) -> dict[str, dict[str, int]]:
        """Each named queue's unfinished jobs per state (``{queue: {state value: n}}``): one pass over the
        table, where counting each queue through :meth:`list_jobs` would scan it once per queue."""
        table, _ = self._open()
        await trio.lowlevel.checkpoint()
        return table.unfinished_by_queue()

    async def list_jobs(self, where: JobFilter, *, limit: int, after_id: str | None = None) -> list[Job]:
        """See :meth:`Store.list_jobs <trioq.stores.Store.list_jobs>`: a scan of the table (no index)."""
        table, _ = self._open()
        await trio.lowlevel.checkpoint()
        return table.list_jobs(where.states, where.task, where.queue, where.tenant, limit, after_id)

    async def counts(self) -> dict[str, int]:
        table, _ = self._open()
        return table.counts()

    async def pause(self, queue: str) -> bool:
        table, _ = self._open()
        queue = label("queue", queue)
        changed = table.pause(queue)
        if changed:
            self._record(PAUSE, (queue,))
            await self._flush()
        else:
            await trio.lowlevel.checkpoint()
        return changed

    async def resume(self, queue: str) -> bool:
        table, config = self._open()
        queue = label("queue", queue)
        changed = table.resume(queue)
        if changed:
            self._record(RESUME, (queue,))
            await self._flush()
            if ready := table.ready_in(queue):
                config.on_ready(ready)
        else:
            await trio.lowlevel.checkpoint()
        return changed

    async def paused(self) -> list[str]:
        table, _ = self._open()
        await trio.lowlevel.checkpoint()
        return table.paused()

    async def limit_usage(self) -> dict[str, tuple[int, int, float | None]]:
        """Each limit key in use: ``(holders, jobs parked for a slot, rate tat or None)``."""
        table, _ = self._open()
        await trio.lowlevel.checkpoint()
        return table.limits.usage()
