"""``open_queue`` and the :class:`Queue` it yields.

The queue's nursery owns the worker pool (with its health watcher), the timer
that promotes scheduled jobs, and maintenance (eviction of old terminal jobs).
The queue talks to its store only through the async Store protocol.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .. import _validate as validate
from .._model import (
    INT64_MAX,
    INT_MIN,
    MAX_PARENTS,
    InvalidJob,
    Job,
    JobNotFound,
    JobSpec,
    JobState,
    Limit,
    TrioqError,
)
from .._registry import Registry
from .._validate import where as _where
from ..policies.limits import fill_keys
from ..stores._base import Added, NewJob, Store, StoreConfig, no_limits
from ..stores.memory import MemoryStore
from . import listing
from .cron import CronScheduler
from .exits import primary_error, without_cancelled
from .explain import reasons as explain_reasons
from .maintenance import Maintenance
from .pools import Pools, worker_split
from .totals import Totals
from .wakeups import precise_wakeups

if TYPE_CHECKING:  # imported when a plan is given: a queue without faults pays nothing for them
    from .._testing.faults import FaultPlan, FaultSession

__all__ = ["Queue", "WaitTimeout", "open_queue"]


#: Seconds a node's claims stay its own without renewal (a shared store rescues them after),
#: unless the store names its own (``PostgresStore(lease=...)``).
_LEASE = 30.0


#: With a store whose calls are round trips, join() asks at most this often.
_JOIN_PAUSE = 0.005


def _lease(store: Store) -> float:
    lease = getattr(store, "lease", _LEASE)
    return lease if isinstance(lease, int | float) and 0 < lease < math.inf else _LEASE


class WaitTimeout(TrioqError, TimeoutError):
    """:meth:`Queue.wait` gave up before the job reached a terminal state."""


@attrs.define(eq=False)
class _Watch:
    """The :meth:`Queue.wait` calls waiting for one job, and its terminal snapshot once it comes."""

    finished: trio.Event = attrs.Factory(trio.Event)
    job: Job | None = None
    waiting: int = 0


class Queue:
    """A running job queue. Get one from :func:`open_queue`; do not construct it."""

    def __init__(
        self,
        registry: Registry,
        store: Store,
        *,
        workers: Mapping[str | None, int],
        heartbeat_timeout: float | None,
        max_ready: int | None,
        retention: float,
        max_retained: int,
        poll_interval: float = 1.0,
        fairness: Mapping[str, float] | None = None,
        overflow: str = "refuse",
    ) -> None:
        self.registry = registry
        self.store = store
        #: This runtime's name in the store: its claims are this node's.
        self.node = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        # With overflow="defer" the store holds the bound (StoreConfig.defer_past): nothing is refused.
        self._max_ready = max_ready if overflow == "refuse" else None
        self._poll_interval = poll_interval
        self._offset = time.time() - trio.current_time()
        # trio's clock object, read by _clock: the same time as trio.current_time(), from any thread too.
        self._trio_clock = trio.lowlevel.current_clock()
        self._totals = Totals()
        lease = _lease(store)
        self._pool = Pools(
            workers,
            registry=registry,
            store=store,
            heartbeat_timeout=heartbeat_timeout,
            clock=self._clock,
            totals=self._totals,
            on_outcome=self._outcome,
            node=self.node,
            lease=lease,
            poll_interval=poll_interval,
        )
        self._maintenance = Maintenance(
            store, offset=self._offset, retention=retention, poll_interval=poll_interval, lease=lease
        )
        # The registry's cron schedules (checked here: open_queue refuses a cron of an unknown task).
        self._cron = CronScheduler(
            registry,
            store,
            clock=self._clock,
            offset=self._offset,
            poll_interval=poll_interval,
            resolve=lambda spec, now: self._resolve(spec, now, None),
        )
        # The jobs wait() calls are waiting for; the store hands each its
        # terminal snapshot as it finishes (StoreConfig.watched, on_finished).
        self._waiters: dict[str, _Watch] = {}
        self._config = StoreConfig(
            clock=self._clock,
            retention=retention,
            max_retained=max_retained,
            node=self.node,
            on_ready=self._pool.wake,
            on_scheduled=self._maintenance.scheduled,
            on_cancel=self._pool.cancel_attempt,
            watched=self._waiters,
            on_finished=self._finished,
            # A registry that declares no limit bounds no key: the stores may skip looking.
            limits=registry.limits.resolve if registry.limits else no_limits,
            fairness=fairness,
            defer_past=max_ready if overflow == "defer" else None,
            takers=self._pool.takers,
            on_claimed=self._pool.hand_over,
        )
        self._progress = trio.Event()
        self._joiners = 0
        self._join_pause = _JOIN_PAUSE if getattr(store, "batch_outcomes", False) else 0.0
        self._closing = False
        self._faults: FaultSession | None = None
        self._scope: trio.CancelScope | None = None
        self._crash: BaseException | None = None

    # ------------------------------------------------------------ producing

    async def enqueue(
        self,
        task: str,
        payload: dict[str, Any] | None = None,
        *,
        delay: float = 0.0,
        priority: int | None = None,
        key: str | None = None,
        max_attempts: int | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        deadline: float | None = None,
        limits: Sequence[str] = (),
        after: Sequence[str] = (),
    ) -> Job:
        """Add one job; returns its snapshot as the enqueue left it: ``ready`` (``scheduled`` with a delay,
        ``waiting`` for parents, ``deferred`` past ``max_ready`` with ``overflow="defer"``), or, on a
        store that claims as it adds (PostgreSQL, while this queue's workers wait), ``running`` under
        epoch 1: a worker of this queue starts it.

        ``priority``, ``max_attempts`` and ``queue`` (the named queue it waits
        in) default to the task's. ``tenant`` names whom the job runs for.
        ``deadline``: seconds from now by which the job must have started; a
        job still waiting then is cancelled, its error saying so (it never
        runs late; a delay past the deadline means it never runs). ``limits``:
        limit keys the job holds besides its task's (each must match a
        limit the registry declares). ``after``: ids of parent jobs; the job
        is ``waiting`` until they all succeed, then ready (or scheduled, if its
        delay, counted from now, has not passed), and is cancelled, its error
        naming the parent, if one ends dead or cancelled (in
        :meth:`enqueue_many` an ``int`` names an earlier spec of the batch). A
        parent the store does not hold (never enqueued, or evicted) is
        :class:`~trioq.InvalidJob`; one that succeeded already is met. With a
        ``key`` that a retained job already holds, nothing is added and that
        job is returned; a key held by a job of another task is refused
        (:class:`~trioq.InvalidJob` naming ``key``). Raises
        :class:`~trioq.UnknownTask`, :class:`~trioq.InvalidJob` (naming the bad
        field), or :class:`~trioq.QueueFull` at ``max_ready``.
        """
        spec = JobSpec(
            task,
            {} if payload is None else payload,
            delay,
            priority,
            key,
            max_attempts,
            queue,
            tenant,
            deadline,
            limits,
            after,
        )
        return (await self.enqueue_many([spec]))[0]

    def enqueue_tx(self, conn: Any, task: str, payload: dict[str, Any] | None = None, **options: Any) -> Job:
        """Add one job inside the caller's own transaction on ``conn`` (a psycopg connection): a plain call.

        Takes the options of :meth:`enqueue` and checks them the same way. The
        job is inserted with ``conn``, so it exists, and workers on any node
        see it, when the caller commits, and never if the caller rolls back
        (the wake-up notification is part of the transaction too). Callable
        from any thread (it blocks on ``conn``), while the queue is open. No
        ``max_ready`` bound applies: the caller's transaction decides what
        commits. Only a :class:`~trioq.PostgresStore` can do this; with any
        other store it raises ``TypeError``.
        """
        add_tx = getattr(self.store, "add_tx", None)
        if add_tx is None:
            raise TypeError(
                f"enqueue_tx needs a queue on a trioq.PostgresStore (it inserts with your psycopg connection); "
                f"this queue's store is a {type(self.store).__name__}: use `await queue.enqueue(...)`"
            )
        self._check_open()
        unknown = set(options) - {
            "delay", "priority", "key", "max_attempts", "queue", "tenant", "deadline", "limits", "after",
        }  # fmt: skip
        if unknown:
            raise TypeError(f"enqueue_tx() got unexpected keyword argument(s) {sorted(unknown)}")
        spec = JobSpec(task, {} if payload is None else payload, **options)
        try:
            now = self._clock()
        except RuntimeError:  # not in the trio thread: the same wall clock, read directly
            now = time.time()
        new = self._resolve(spec, now, None)
        if not callable(getattr(conn, "cursor", None)):
            raise TypeError(
                f"enqueue_tx needs your psycopg connection (a psycopg.Connection), got {type(conn).__name__}"
            )
        added = add_tx(conn, [new], now)
        (job,) = added
        if not getattr(added, "existing", ()):  # a new job (if the caller commits), not its key's holder
            self._totals.enqueued += 1
        assert isinstance(job, Job)
        return job

    async def enqueue_many(self, specs: Sequence[JobSpec]) -> Added:
        """Add several jobs at once, all or nothing; returns their snapshots in order.

        The list is a :class:`trioq.stores.Added`: its ``existing`` holds the indexes of the specs
        whose idempotency key found a job that holds it (that job is returned; nothing was added).

        A checkpoint, as trio's own async functions are: a caller cancelled
        before the call adds nothing, and even when no store I/O waits, other
        tasks get to run (a producer loop cannot starve the workers). Once the
        jobs are added, a cancel waits for their record (the store's calls are
        not cancel points once applied) and is delivered at the caller's next
        checkpoint.
        """
        self._check_open()
        await trio.lowlevel.checkpoint_if_cancelled()
        now = self._clock()
        new = [self._resolve(spec, now, i if len(specs) > 1 else None) for i, spec in enumerate(specs)]
        jobs = await self.store.add(new, max_pending=self._max_ready)
        self._totals.enqueued += len(jobs) - len(jobs.existing)
        return jobs

    def _resolve(self, spec: JobSpec, now: float, index: int | None) -> NewJob:
        """Validate ``spec`` and fill in the task's defaults (hot: every enqueued job).

        Field names in errors are built only on the way to raising, but for a
        batch's payload prefix (``jobs[3].``), which the payload checks take.
        """
        if type(spec) is not JobSpec and not isinstance(spec, JobSpec):
            where = _where(index)
            raise InvalidJob(
                f"{where}expected a trioq.JobSpec, got {type(spec).__name__}", field=where.rstrip(".") or "job"
            )
        task = spec.task
        if not isinstance(task, str):
            raise InvalidJob(f"{_where(index)}task must be a string, got {task!r}", field=f"{_where(index)}task")
        definition = self.registry[task]
        payload = spec.payload
        if payload or type(payload) is not dict:
            if not isinstance(payload, dict) or not all(isinstance(k, str) for k in payload):
                where = _where(index)
                raise InvalidJob(
                    f"{where}payload must be a dict with string keys, got {payload!r:.80}", field=f"{where}payload"
                )
            # The store checks the values (JSON, nesting, size) as it packs them.
            definition.check_payload(payload, "" if index is None else _where(index))
        elif definition.required:
            definition.check_payload(payload, _where(index))
        delay = spec.delay
        if not (type(delay) is float and 0.0 <= delay < math.inf):
            delay = validate.number(f"{_where(index)}delay", delay)
        priority = spec.priority
        if priority is None:
            priority = definition.priority
        elif type(priority) is not int or not INT_MIN <= priority <= INT64_MAX:
            priority = validate.integer(f"{_where(index)}priority", priority, maximum=INT64_MAX)
        max_attempts = spec.max_attempts
        if max_attempts is None:
            max_attempts = definition.max_attempts
        elif type(max_attempts) is not int or not 1 <= max_attempts <= INT64_MAX:
            max_attempts = validate.integer(f"{_where(index)}max_attempts", max_attempts, minimum=1, maximum=INT64_MAX)
        key = spec.key
        if key is not None and (not isinstance(key, str) or not key):
            where = _where(index)
            raise InvalidJob(f"{where}key must be a non-empty string or None, got {key!r}", field=f"{where}key")
        queue, tenant, deadline, limits, after = spec.queue, spec.tenant, spec.deadline, spec.limits, spec.after
        if (
            queue is None
            and tenant is None
            and deadline is None
            and limits == ()
            and after == ()
            and not definition.limits
        ):
            return NewJob(task, payload, priority, key, max_attempts, delay, definition.queue)
        queue = definition.queue if queue is None else validate.label(f"{_where(index)}queue", queue)
        if tenant is not None:
            tenant = validate.label(f"{_where(index)}tenant", tenant)
        if deadline is not None:
            deadline = validate.number(f"{_where(index)}deadline", deadline, above=True)
        keys = fill_keys(definition.limits, limits, payload, tenant, self.registry.limits, _where(index))
        if keys and self._config.limits is no_limits:
            field = f"{_where(index)}limits"
            raise InvalidJob(
                f"{field}: the registry declared no limit when this queue opened, so its store enforces none;"
                " declare every registry.limit(...) before open_queue",
                field=field,
            )
        parents = _parents(after, index, _where(index)) if after else ()
        return NewJob(task, payload, priority, key, max_attempts, delay, queue, tenant, deadline, keys, parents)

    # ------------------------------------------------------------- querying

    async def get(self, job_id: str) -> Job:
        """The job's current snapshot; raises :class:`~trioq.JobNotFound`.

        A terminal job is returned once its outcome is durable (as with
        :meth:`wait`): a worker's success waits for a commit of the log, and
        a caller told "succeeded" must not see the job run again after a crash.
        """
        await trio.lowlevel.checkpoint()
        job = await self.store.get(job_id)
        if job.state.terminal:
            await self.store.sync(job_id)  # this job's records: at once when they are durable
        return job

    async def list(
        self,
        state: JobState | str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        after_id: str | None = None,
    ) -> builtins.list[Job]:
        """Snapshots of the jobs the filters take, newest enqueued first: one page of at most
        ``limit`` (1 to 1,000). ``state``: a :class:`~trioq.JobState` or its value; ``task``,
        ``queue``, ``tenant``: exact names; ``None`` takes any. For the next page pass the last
        job's id as ``after_id``; a short page is the last.

        Raises :class:`~trioq.InvalidJob` naming a bad filter, ``limit``, or an ``after_id`` the
        store no longer holds (evicted since the last page: start from the first again).
        """
        where = listing.job_filter(state, task, queue, tenant)
        count = listing.page_limit(limit, listing.MAX_PAGE)
        if after_id is not None and not isinstance(after_id, str):
            raise InvalidJob(f"after_id must be a job id (a string), got {after_id!r:.40}", field="after_id")
        jobs = await self.store.list_jobs(where, limit=count, after_id=after_id)
        if any(job.state.terminal for job in jobs):
            await self.store.sync()  # as get(): an outcome is reported once durable
        return jobs

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Return the job once it is terminal (succeeded, dead or cancelled) and, with a
        store that logs, once that outcome is durable.

        Raises :class:`~trioq.JobNotFound` for an id the store does not know
        when the wait begins, and a ``TimeoutError`` (``trioq``'s
        ``WaitTimeout``) after ``timeout`` seconds (``None`` or ``math.inf``:
        no limit) if the job is not terminal by then. A waiter gets the job's
        terminal snapshot even if the job is evicted right after it finished
        (a small ``max_retained``). ``timeout`` bounds the wait for the
        outcome's record to be durable too (a worker's success joins the
        log's next commit, within ``LAZY_COMMIT_DELAY``): a terminal job whose
        outcome is not durable by then is a ``WaitTimeout`` as well.
        """
        if timeout is None:
            deadline = math.inf
        else:
            deadline = trio.current_time() + validate.number("timeout", timeout, infinite=True)
        await trio.lowlevel.checkpoint()
        # Watch before reading the job: an outcome that lands while the store
        # call is in flight must still reach us.
        watch = self._waiters.get(job_id)
        if watch is None:
            watch = self._waiters[job_id] = _Watch()
        watch.waiting += 1
        try:
            job = await self.store.get(job_id)
            while not job.state.terminal:
                # The store's hint (on_finished) ends the wait; a look every
                # poll interval hears of an outcome no hint told of.
                with trio.move_on_at(min(deadline, trio.current_time() + self._poll_interval)):
                    await watch.finished.wait()
                if watch.job is not None:
                    job = watch.job
                    break
                if trio.current_time() >= deadline:
                    raise WaitTimeout(f"job {job_id} is still {job.state.value} after {timeout:g}s")
                job = await self.store.get(job_id)
            # The table can be ahead of the log: a worker does not wait for
            # its outcome's record. Whoever waits hears of it once durable,
            # within the timeout too: the wait is for this job's records alone,
            # so a job long durable returns at once whatever else is in flight.
            with trio.move_on_at(deadline):
                await self.store.sync(job_id)
                return job
            raise WaitTimeout(
                f"job {job_id} is {job.state.value}, but its outcome was not yet durable after {timeout:g}s"
            )
        finally:
            watch.waiting -= 1
            if not watch.waiting and self._waiters.get(job_id) is watch:
                del self._waiters[job_id]

    async def join(self) -> None:
        """Until no job is ready, scheduled, running, deferred or waiting (returns at once if none is).

        With ``workers=0`` and pending jobs this waits until another queue on the
        same store drains them.
        """
        await trio.lowlevel.checkpoint()
        self._joiners += 1
        try:
            while True:
                progress = self._progress
                if progress.is_set():
                    progress = self._progress = trio.Event()
                if not await self._pending():
                    await self.store.sync()  # and every outcome behind that is durable
                    return
                # This node's outcomes set the event; another node's are seen by
                # the poll (_poll_joiners sets it too). No cancel scope here: a
                # drain wakes this loop every few jobs.
                await progress.wait()
                if self._join_pause:
                    # A shared store counts its jobs with a query: look at most
                    # every _JOIN_PAUSE, not after every batch of a drain.
                    await trio.sleep(self._join_pause)
        finally:
            self._joiners -= 1

    async def stats(self) -> dict[str, Any]:
        """A JSON-ready snapshot: ``jobs`` per state, ``totals`` since open, ``workers`` (this node's,
        across its pools), and ``queues``: for each named queue this node serves or that is paused,
        ``{"paused": bool, "workers": this node's pool for it (0: none of its own)}``; the pool that
        serves every queue is under ``"*"``; and ``limits``: for each limit key declared by name or in
        use (held by a running attempt, blocking a job, or with a rate still recovering), ``{"in_use":
        attempts holding it (on every node), "cap": its max now (None: no max), "rate", "per",
        "tokens": starts its rate allows at once now (None: no rate), "blocked": ready jobs waiting
        for a free slot of it}``. A store without ``limit_usage`` reports no use. ``cron``: each
        cron schedule of the registry, by name, ``{"name", "schedule", "task", "tz", "next_run"
        (wall time), "last_tick" (the store's, None before any), "enqueued" (by this node)}``."""
        await trio.lowlevel.checkpoint()
        counts = await self.store.counts()
        paused = await self.store.paused()
        sizes = self._pool.sizes()
        queues = {name: {"paused": name in paused, "workers": sizes.get(name, 0)} for name in sorted({*sizes, *paused})}
        return {
            "jobs": counts,
            "totals": attrs.asdict(self._totals),
            "workers": self._pool.stats(),
            "queues": queues,
            "limits": await self._limit_stats(),
            "cron": await self._cron.stats(),
        }

    async def _limit_stats(self) -> dict[str, dict[str, Any]]:
        """``stats()["limits"]``: each declared exact key and each key in use (see :meth:`stats`)."""
        book = self.registry.limits
        if not book:
            return {}
        usage_of = getattr(self.store, "limit_usage", None)
        usage: dict[str, tuple[int, int, float | None]] = await usage_of() if usage_of is not None else {}
        keys = {limit.key for limit in book if not limit.key.endswith("*")} | set(usage)
        now = self._clock()
        out: dict[str, dict[str, Any]] = {}
        for key in sorted(keys):
            limit = book.resolve(key)
            if limit is None:
                continue
            in_use, blocked, tat = usage.get(key, (0, 0, None))
            out[key] = {
                "in_use": in_use,
                "cap": limit.max,
                "rate": limit.rate,
                "per": limit.per,
                "tokens": _tokens(limit, tat, now),
                "blocked": blocked,
            }
        return out

    async def explain(self, job_id: str | Job) -> dict[str, Any]:
        """Why the job is not running now, JSON-ready: ``{"id", "state", "queue", "reasons": [...]}``.

        ``job_id`` may be a :class:`~trioq.Job` snapshot of this queue's job that the caller holds:
        it is explained as it stands in that snapshot (its state is not read again, nor is it
        checked to be in this queue's store; the pauses and keys are read).

        Each reason is ``{"kind", "message", ...}`` (most decisive first): ``scheduled`` (not due
        yet), ``paused`` (its queue), ``limit`` (a key's slots all held), ``rate`` (no token of a
        key's rate yet), ``no_workers`` (no pool of this node serves its queue), ``busy`` (its pool
        has no idle worker), ``claimable``, ``deferred`` (enqueued past ``max_ready``, waiting to
        be admitted), ``waiting`` (for parents: ``parents`` maps the ids of those not succeeded
        yet to their states); ``running`` and ``finished`` for those states; plus a ``deadline`` entry
        while one is still to meet. Found at one moment, not recorded: a reason may pass as it is
        read. Raises :class:`~trioq.JobNotFound`.
        """
        await trio.lowlevel.checkpoint()
        job = job_id if isinstance(job_id, Job) else await self.store.get(job_id)
        paused = await self.store.paused()
        usage_of = getattr(self.store, "limit_usage", None)
        usage = await usage_of() if usage_of is not None and job.limits else {}
        parents: dict[str, JobState | None] = {}
        if job.state is JobState.WAITING:
            for parent_id in job.after:
                try:
                    parents[parent_id] = (await self.store.get(parent_id)).state
                except JobNotFound:
                    parents[parent_id] = None
        found = explain_reasons(
            job,
            now=self._clock(),
            paused=paused,
            usage=usage,
            limit_of=self.registry.limits.resolve,
            idle=self._pool.idle_for(job.queue),
            parents=parents,
        )
        return {"id": job.id, "state": job.state.value, "queue": job.queue, "reasons": found}

    def observe_attempts(self, observer: Callable[[str, float, float], None]) -> None:
        """Call ``observer(task, queue_wait_s, run_s)`` after every attempt (metrics use this).

        ``queue_wait_s`` runs from the job's ``run_at`` to the attempt's start.
        Observers run on the worker's path: keep them cheap.
        """
        self._pool.observers.append(observer)

    def readiness(self) -> tuple[bool, str]:
        """Whether the queue can run work now, and why not: for ``/readyz``.

        Ready means open (not shutting down) with at least one healthy worker.
        """
        if self._closing:
            return False, "the queue is shutting down"
        if self._pool.healthy == 0:
            return False, "no healthy worker (all stuck, or a producer-only queue)"
        return True, "ok"

    # ------------------------------------------------------------- changing

    async def cancel(self, job_id: str) -> Job:
        """Cancel a job that has not finished; a running attempt is stopped at once.

        Cancelling a terminal job changes nothing and returns it as it is.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        outcome = await self.store.cancel(job_id)  # not a cancel point once applied
        # A running attempt heard of it through the store's on_cancel hint.
        if outcome.changed:
            self._totals.cancelled += 1
            self._outcome()
        return outcome.job

    async def pause(self, queue: str) -> bool:
        """Stop every node from claiming jobs of the named queue ``queue`` until :meth:`resume`.

        Persisted in the store (it outlasts this queue, and a restart); running
        attempts finish; enqueueing into the queue goes on. Returns whether it
        was running before (``False``: paused already). Raises
        :class:`~trioq.InvalidJob` (field ``queue``) for a name no queue can have.
        """
        self._check_open()
        name = validate.label("queue", queue)
        await trio.lowlevel.checkpoint_if_cancelled()
        return await self.store.pause(name)

    async def resume(self, queue: str) -> bool:
        """Let every node claim jobs of ``queue`` again; returns whether it was paused."""
        self._check_open()
        name = validate.label("queue", queue)
        await trio.lowlevel.checkpoint_if_cancelled()
        return await self.store.resume(name)

    async def retry(self, job_id: str) -> Job:
        """Run a dead or cancelled job again from scratch (attempts reset to 0).

        Raises :class:`~trioq.InvalidJob` (field ``state``) for other states.
        """
        self._check_open()
        await trio.lowlevel.checkpoint_if_cancelled()
        return await self.store.retry(job_id)  # not a cancel point once applied

    async def retry_many(
        self,
        state: JobState | str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """:meth:`retry` each dead or cancelled job the filters take (as :meth:`list`'s; ``state`` one of
        the two, ``None`` both): the newest ``limit`` of them (up to 10,000), oldest first; returns how
        many it retried. Call again until it returns 0 to retry them all.

        Among the jobs of one call a flow's parent goes before its children, and the children its end
        cancelled wait again without being counted; a child whose parent is still dead or cancelled is
        passed over (a later call that retries the parent revives it), as is a job that moved on since
        it was listed. Raises :class:`~trioq.InvalidJob` naming a bad filter (another ``state``
        included) or ``limit``.
        """
        self._check_open()
        where = listing.job_filter(state, task, queue, tenant, among=listing.RETRYABLE, action="retry_many")
        count = listing.page_limit(limit, listing.MAX_BULK)

        async def retried(job_id: str) -> bool:
            await self.store.retry(job_id)
            return True

        return await listing.act_on_each(self.store, where, count, retried)

    async def cancel_many(
        self,
        state: JobState | str | None = None,
        task: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> int:
        """:meth:`cancel` each unfinished job the filters take (as :meth:`list`'s; ``state`` any but
        succeeded, dead and cancelled, ``None`` all of those): the newest ``limit`` of them (up to
        10,000), oldest first; returns how many it cancelled. Call again until it returns 0 to cancel
        them all. Running attempts stop at once; a flow's children cancelled by their parent's cancel
        are not counted again. Raises :class:`~trioq.InvalidJob` naming a bad filter or ``limit``.
        """
        where = listing.job_filter(state, task, queue, tenant, among=listing.CANCELLABLE, action="cancel_many")
        count = listing.page_limit(limit, listing.MAX_BULK)

        async def cancelled(job_id: str) -> bool:
            outcome = await self.store.cancel(job_id)
            if outcome.changed:
                self._totals.cancelled += 1
                self._outcome()
            return outcome.changed

        return await listing.act_on_each(self.store, where, count, cancelled)

    # ------------------------------------------------------------- internals

    def _clock(self) -> float:
        """Wall-clock seconds on trio's clock (``StoreConfig.clock``): callable from a store's threads."""
        return self._trio_clock.current_time() + self._offset

    async def _pending(self) -> bool:
        """Whether any job is ready, scheduled, running, deferred or waiting (a store may answer it cheaper
        than its counts)."""
        has_pending = getattr(self.store, "has_pending", None)
        if has_pending is not None:
            return bool(await has_pending())
        counts = await self.store.counts()
        live = counts["ready"] + counts["scheduled"] + counts["running"]
        return live + counts.get("deferred", 0) + counts.get("waiting", 0) > 0

    def _check_open(self) -> None:
        if self._closing:
            raise TrioqError("the queue is shutting down; it accepts no new work")

    def _outcome(self) -> None:
        """An attempt's outcome was recorded: join() looks again."""
        if self._joiners:
            self._progress.set()  # join() swaps in a fresh event when it looks again

    async def _poll_joiners(self) -> None:
        """Every ``poll_interval``, make :meth:`join` look again (outcomes of other nodes)."""
        if self._poll_interval == math.inf:
            return
        while True:
            await trio.sleep(self._poll_interval)
            if self._joiners:
                self._progress.set()

    def _finished(self, job: Job) -> None:
        """The store's call for a watched job that just became terminal (inside the transition)."""
        watch = self._waiters.pop(job.id, None)
        if watch is not None:
            watch.job = job
            watch.finished.set()

    def _die(self, crash: BaseException) -> None:
        """A simulated crash: stop everything at once; ``open_queue`` raises ``crash``."""
        self._crash = crash
        self._closing = True
        self._pool.cancel()
        if self._scope is not None:
            self._scope.cancel()

    async def _drain(self, grace: float) -> None:
        """Stop claiming and give running attempts up to ``grace`` seconds to finish."""
        self._pool.stop_claiming()
        with trio.move_on_after(grace):
            await self._pool.wait_drained()


@asynccontextmanager
async def open_queue(
    registry: Registry,
    *,
    store: Store | None = None,
    workers: int | Mapping[str, int] = 10,
    heartbeat_timeout: float | None = None,
    shutdown_grace: float = 10.0,
    max_ready: int | None = None,
    overflow: str = "refuse",
    fairness: Mapping[str, float] | None = None,
    retention: float = 3600.0,
    max_retained: int = 100_000,
    faults: FaultPlan | None = None,
    precise_timers: bool = False,
    poll_interval: float = 1.0,
) -> AsyncIterator[Queue]:
    """Open a queue on ``store`` (a fresh ``MemoryStore`` if ``None``) with ``workers`` workers.

    Leaving the block normally stops claiming, gives running attempts
    ``shutdown_grace`` seconds, then cancels them and releases their jobs
    (not counted as attempts). Leaving it with an exception (or cancelled)
    skips the grace. ``workers=0`` opens a producer-only queue; a mapping
    such as ``{"default": 8, "email": 4}`` gives each named queue its own pool
    of workers, and this node then claims from those queues only. Exceptions of
    the body and trioq's own errors come out as themselves, never wrapped in
    an ``ExceptionGroup``: when several errors come out at once (a second
    Ctrl-C during shutdown, a full disk failing the writer and every caller),
    one is raised (a ``KeyboardInterrupt`` or ``SystemExit`` first, then the
    block's own error) and the others are logged to the ``trioq`` logger and
    named in a note on it.

    ``precise_timers=True`` makes every deadline of this trio run wake on time
    while the queue is open (CPython rounds trio's waits up to whole
    milliseconds, so a deadline is otherwise reached up to 1 ms late): a Linux
    timerfd armed for the run's next deadline. It changes the timers of the
    whole run, the host program's included, so it is off unless asked for;
    ``trioq serve`` turns it on. It does nothing under a ``MockClock`` or where
    timerfd is missing.

    ``max_ready``: how many jobs may be ready or scheduled at once (``None``:
    no bound). What an enqueue past it does is ``overflow``'s: ``"refuse"``
    (the default) raises :class:`~trioq.QueueFull` (HTTP 503), adding
    nothing; ``"defer"`` adds the job (durably, keyed) as ``deferred``: not
    claimable, admitted (ready, or scheduled if its delay runs on) oldest
    first, fairly across tenants with ``fairness`` on, as soon as fewer than
    ``max_ready`` jobs are ready or scheduled. A deferred job's ``deadline``
    runs from its enqueue; ``join()`` waits for deferred jobs too. Retries and
    snoozes are never deferred (they may take the count past ``max_ready``).
    On a shared store every node must use the same bound.
    ``fairness``: ``None`` (plain priority, then FIFO)
    or ``{tenant: weight}``: among claimable jobs of the best priority, the
    next claim goes to the tenant furthest behind its weighted share
    (unlisted tenants, and jobs without a tenant, weigh 1.0; ``{}`` turns it
    on with equal weights); a tenant returning after an idle spell starts
    level with the others, banking no credit.

    ``poll_interval``: seconds between looks at the store that no hint
    prompted (for jobs another process made ready or scheduled, outcomes
    another node recorded, leases that lapsed); hints make the common case
    immediate, and the poll bounds how long a lost one delays anything.

    ``faults`` applies a :class:`trioq.testing.FaultPlan`: failures, hangs and
    delays in attempts, and a simulated crash, after which
    :class:`trioq.testing.SimulatedCrash` comes out of this block.
    """
    if not isinstance(registry, Registry):
        raise TypeError(f"open_queue needs a trioq.Registry, got {type(registry).__name__}")
    split = worker_split(workers)
    validate.optional_number("heartbeat_timeout", heartbeat_timeout, above=True, infinite=True, error=ValueError)
    validate.number("shutdown_grace", shutdown_grace, infinite=True, error=ValueError)
    if max_ready is not None:
        validate.integer("max_ready", max_ready, minimum=1, error=ValueError)
    if overflow not in ("refuse", "defer"):
        raise ValueError(f'overflow must be "refuse" or "defer", got {overflow!r}')
    if overflow == "defer" and max_ready is None:
        raise ValueError('overflow="defer" needs a max_ready bound to defer past (an int >= 1)')
    fairness = _fairness(fairness)
    validate.flag("precise_timers", precise_timers)
    poll_interval = validate.number("poll_interval", poll_interval, above=True, infinite=True, error=ValueError)
    if faults is not None:
        from .._testing.faults import FaultPlan, FaultSession
    if faults is not None and not isinstance(faults, FaultPlan):
        raise TypeError(f"faults must be a trioq.testing.FaultPlan or None, got {type(faults).__name__}")
    queue = Queue(
        registry,
        MemoryStore() if store is None else store,
        workers=split,
        heartbeat_timeout=heartbeat_timeout,
        max_ready=max_ready,
        retention=retention,
        max_retained=max_retained,
        poll_interval=poll_interval,
        fairness=fairness,
        overflow=overflow,
    )
    if faults is not None:
        queue._faults = FaultSession(
            faults,
            registry=registry,
            heartbeat_timeout=heartbeat_timeout,
            store=queue.store,
            executors=queue._pool.executors,
            on_crash=queue._die,
        )
    body_error: BaseException | None = None
    try:
        wakeups = precise_wakeups() if precise_timers else contextlib.nullcontext()
        async with wakeups, queue.store.session(queue._config), trio.open_nursery() as nursery:
            if queue._faults is not None:
                queue._faults.opened = True
            queue._scope = nursery.cancel_scope
            await nursery.start(queue._pool.run)
            nursery.start_soon(queue._maintenance.run)
            nursery.start_soon(queue._cron.run)
            nursery.start_soon(queue._poll_joiners)
            graceful = False
            try:
                yield queue
                graceful = True
            except BaseException as exc:
                body_error = None if without_cancelled(exc) is None else exc
                if queue._faults is not None and queue._crash is None and body_error is not None:
                    # The body failed first: a crash point reached while the
                    # queue shuts down must not hide that failure.
                    queue._faults.arm_crash(None)
                raise
            finally:
                try:
                    queue._closing = True
                    if graceful and queue._crash is None:
                        await queue._drain(shutdown_grace)
                finally:
                    queue._pool.cancel()
                    nursery.cancel_scope.cancel()
    except BaseException as exc:
        if queue._crash is not None:
            raise queue._crash from None  # it died: whatever else broke on the way down is moot
        if not isinstance(exc, BaseExceptionGroup):
            raise
        single = primary_error(exc, body_error)
        if single is exc:
            raise
        # Re-raise the lone exception as itself, keeping its own cause and
        # context rather than chaining it to the group.
        cause, context, suppress = single.__cause__, single.__context__, single.__suppress_context__
        try:
            raise single
        finally:
            single.__cause__, single.__context__, single.__suppress_context__ = cause, context, suppress
            del single, exc
    finally:
        if queue._faults is not None:
            queue._faults.close()
    if queue._crash is not None:
        raise queue._crash


def _fairness(fairness: object) -> dict[str, float] | None:
    """``open_queue``'s ``fairness``, checked: ``None``, or a copy of a ``{tenant: weight}`` mapping
    whose tenants are labels and whose weights are finite numbers > 0."""
    if fairness is None:
        return None
    if not isinstance(fairness, Mapping):
        raise TypeError(f"fairness must be None or a mapping of tenant to weight, got {type(fairness).__name__}")
    checked: dict[str, float] = {}
    for tenant, weight in fairness.items():
        name = validate.label("fairness tenant", tenant, error=ValueError)
        checked[name] = validate.number(f"fairness weight of {name!r}", weight, above=True, error=ValueError)
    return checked


def _tokens(limit: Limit, tat: float | None, now: float) -> int | None:
    """How many starts ``limit``'s rate admits at once at ``now``, given its ``tat`` (None: unused)."""
    if limit.rate is None:
        return None
    burst = 1 if limit.burst is None else limit.burst
    if tat is None or tat <= now:
        return burst
    interval = limit.interval
    spare = (limit.tolerance + interval - (tat - now)) / interval
    return max(0, min(burst, math.floor(spare + 1e-9)))


def _parents(after: object, index: int | None, where: str) -> tuple[str | int, ...]:
    """A spec's ``after`` as a tuple of parent ids and batch indexes, each once; else
    :class:`~trioq.InvalidJob` naming ``after``. An ``int`` must name an earlier spec of the batch
    (``0 <= i < index``)."""
    field = f"{where}after"
    if isinstance(after, str | bytes) or not isinstance(after, Sequence):
        raise InvalidJob(
            f"{field} must be a list of parent job ids (or, in enqueue_many, ints naming earlier specs), "
            f"got {after!r:.60}",
            field=field,
        )
    if len(after) > MAX_PARENTS:
        raise InvalidJob(f"{field} names {len(after)} parents; a job may have at most {MAX_PARENTS}", field=field)
    out: list[str | int] = []
    for parent in after:
        if isinstance(parent, bool) or not isinstance(parent, str | int):
            raise InvalidJob(f"{field} must hold job ids (strings) or ints, got {parent!r:.60}", field=field)
        if isinstance(parent, int):
            parent = int.__index__(parent)
            if index is None or not 0 <= parent < index:
                shown = "no spec comes before this one" if not index else f"it must be from 0 to {index - 1}"
                raise InvalidJob(f"{field}: {parent} names no earlier spec of this batch ({shown})", field=field)
        elif not parent:
            raise InvalidJob(f"{field}: a parent job id cannot be empty", field=field)
        else:
            parent = str.__str__(parent)
        if parent not in out:
            out.append(parent)
    return tuple(out)
