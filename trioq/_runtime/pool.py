"""The worker pool: ``size`` worker tasks and the parts they share (River's split).

Each worker loops: take a claimed job from the :class:`~.producer.Producer`,
run one attempt with the :class:`~.executor.Executor` inside the worker's
cancel scope, hand the outcome to the :class:`~.completer.Completer`. The
:class:`~.watchdog.Watchdog` replaces a worker stuck past its attempt's
deadline. Workers reuse one cancel scope across attempts until something (a
deadline, a cancel) spends it: entering a fresh scope per attempt costs more
than a whole no-op job.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Awaitable, Callable, Sequence
from time import perf_counter

import attrs
import trio

from .._context import Attempt
from .._model import Job, JobState, error_text
from .._registry import Registry, TaskDef
from ..stores._base import Failed, Outcome, Released, Snoozed, Store, Succeeded
from .completer import Completer
from .executor import Executor, read_parents
from .exits import without_cancelled
from .logs import debug_enabled, log_started
from .producer import Producer
from .totals import Totals
from .watchdog import STUCK_GRACE, Watchdog

__all__ = ["STUCK_GRACE", "WorkerPool"]


@attrs.define(eq=False)
class _Worker:
    """One worker task's state: the job it holds (claimed, not yet settled)."""

    slot: int
    started: float = 0.0  # perf_counter() when the current attempt began (for its logged duration)
    wall_started: float = 0.0  # the store's clock then (kept only for observers)
    trio_started: float = 0.0  # trio.current_time() then (kept only for adaptive limits)
    reporting: bool = False  # the attempt told its adaptive keys it started, and has not ended for them
    job: Job | None = None
    task: TaskDef | None = None
    attempt: Attempt | None = None
    stuck: bool = False
    unyielded: int = 0


_SUCCEEDED = JobState.SUCCEEDED

#: A worker checkpoints after this many jobs in a row (see _serve).
_JOBS_PER_CHECKPOINT = 4


class WorkerPool:
    """``size`` workers sharing one store; see the module docstring.

    ``clock`` is the wall clock the store uses; ``on_outcome()`` is called
    after every attempt outcome recorded (success, failure, death, snooze):
    how a waiter hears of a terminal job is the store's
    (``StoreConfig.on_finished``).
    """

    def __init__(
        self,
        *,
        registry: Registry,
        store: Store,
        size: int,
        heartbeat_timeout: float | None,
        clock: Callable[[], float],
        totals: Totals,
        on_outcome: Callable[[], None],
        node: str,
        lease: float,
        poll_interval: float,
        queues: tuple[str, ...] | None = None,
    ) -> None:
        self.size = size
        #: The named queues this pool's workers claim from (``None``: every queue).
        self.queues = queues
        self._registry = registry
        self._adaptive = registry.limits.has_adaptive  # attempts holding keys report to their caps
        self._store = store
        self._clock = clock
        self._totals = totals
        self._on_outcome = on_outcome
        self.producer = Producer(store, node=node, lease=lease, poll_interval=poll_interval, queues=queues)
        self.executor = Executor(registry=registry, heartbeat_timeout=heartbeat_timeout, processes=size, totals=totals)
        self.executor.read_parents = functools.partial(read_parents, store)
        self.completer = Completer(
            store, totals=totals, node=node, lease=lease, on_outcome=on_outcome, on_lost=self._lost
        )
        self.watchdog = Watchdog(self.executor, on_stuck=self._stuck_worker, record=self._record_hung)
        self.executor.on_deadline = self.watchdog.watch
        self._workers: set[_Worker] = set()  # live worker tasks, stuck ones included
        self._healthy = 0
        self._stuck = 0
        self._replaced = 0
        self._drained = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._fatal: Exception | None = None
        self._fatal_notes: set[str] = set()
        #: Called as ``observer(task, queue_wait_s, run_s)`` after each attempt.
        self.observers: list[Callable[[str, float, float], None]] = []

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the workers and their helpers until :meth:`cancel` (or the caller) stops them."""
        try:
            try:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    nursery.start_soon(self._guarded, self.watchdog.run)
                    nursery.start_soon(self._guarded, self.producer.poll)
                    nursery.start_soon(self._guarded, self._extend_leases)
                    nursery.start_soon(self._guarded, self.completer.run)
                    for slot in range(self.size):
                        nursery.start_soon(self._work, slot)
                    if self.size == 0:
                        self._drained.set()
                    task_status.started()
            finally:
                with trio.CancelScope(shield=True):
                    await self.producer.close()
                    await self.completer.drain()  # outcomes handed over as the workers unwound
        except BaseException as exc:
            # A store error stopped the pool, and the queue's cancel came
            # after it (a crash during the shutdown drain): the error is what
            # happened, the cancel only its consequence.
            if self._fatal is not None and without_cancelled(exc) is None:
                raise self._fatal from None
            raise
        finally:
            self.executor.processes.close()
        if self._fatal is not None:
            raise self._fatal

    async def _guarded(self, part: Callable[[], Awaitable[None]]) -> None:
        try:
            await part()
        except Exception as exc:
            self._crash(exc)

    async def _extend_leases(self) -> None:
        await self.completer.extend_leases(self._held, self._lapsed)

    async def _lapsed(self, held: Sequence[tuple[str, int]]) -> None:
        """The node could not renew its lease in time (see ``Completer.extend_leases``): stop the attempts
        of the claims ``held`` names and give their jobs back, uncounted. The store applies a give-back
        once it answers again, and refuses it for a job another node rescued meanwhile.

        Every attempt is stopped before any give-back is handed over (an inline one waits for the store,
        which may be down). An attempt that has ended already is left alone: its own outcome is on its
        way, and a give-back beside it could overtake it."""
        executor, producer = self.executor, self.producer
        named = set(held)
        back: list[tuple[Job, float]] = []
        for worker in list(self._workers):
            job = worker.job
            if job is None or (job.id, job.epoch) not in named:
                continue
            if executor.cancel_attempt(job.id, job.epoch):  # a live attempt, stopped: no outcome of its own
                back.append((job, worker.started))
            elif worker.attempt is None:  # claimed, its attempt not started (waiting for a CPU)
                executor.cancelled_claims.add((job.id, job.epoch))
                back.append((job, worker.started))
        for job in producer.waiting():
            if (job.id, job.epoch) in named and producer.drop(job.id, job.epoch):
                back.append((job, perf_counter()))
        if back:
            self.watchdog.watch(trio.current_time())
        for job, started in back:
            await self.completer.complete(Released(job.id, job.epoch), job, started)

    def _held(self) -> list[tuple[str, int]]:
        """Every claim this node holds: its workers' (running, or waiting for a CPU) and the
        producer's not yet taken."""
        held = [(w.job.id, w.job.epoch) for w in self._workers if w.job is not None and not w.stuck]
        held.extend((job.id, job.epoch) for job in self.producer.waiting())
        return held

    def _crash(self, exc: Exception) -> None:
        """A store call failed outside any handler: stop the pool and report the first error.

        When one store call fails, every worker's next call usually fails the
        same way; the first error propagates and the others are attached to it
        as notes, so one broken store reads as one error.
        """
        if self._fatal is None:
            self._fatal = exc
            self.cancel()
            return
        note = f"also raised in another trioq worker: {error_text(exc)}"
        if note not in self._fatal_notes:
            self._fatal_notes.add(note)
            self._fatal.add_note(note)

    def wake(self, n: int) -> None:
        """The store's wake-up hint: ``n`` jobs may have become claimable."""
        self.producer.wake(n)

    def stop_claiming(self) -> None:
        """Let busy workers finish their attempt, then exit; idle ones exit now."""
        self.producer.stop()
        if self._healthy == 0:
            self._drained.set()

    async def wait_drained(self) -> None:
        """Until every healthy worker has exited (after :meth:`stop_claiming`) and their outcomes are sent."""
        await self._drained.wait()
        await self.completer.flush()

    def cancel(self) -> None:
        """Cancel everything: running attempts release their jobs as they unwind."""
        self.producer.stopping = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def cancel_attempt(self, job_id: str, epoch: int) -> None:
        """The store's ``on_cancel`` hint: stop the attempt running ``job_id`` under ``epoch``.

        A claim whose attempt has not started (waiting for a CPU, for a fault
        plan's numbering, or in the producer) never starts; one whose attempt
        has ended already needs nothing (its outcome will be refused).
        """
        if self.executor.cancel_attempt(job_id, epoch):
            self.watchdog.watch(trio.current_time())
            return
        if self.producer.drop(job_id, epoch):
            return
        for worker in self._workers:
            job = worker.job
            if job is not None and job.id == job_id and job.epoch == epoch and worker.attempt is None:
                self.executor.cancelled_claims.add((job_id, epoch))

    def _lost(self, job_id: str, epoch: int) -> None:
        """The store no longer gives this node ``job_id`` under ``epoch`` (a lease renewal said so)."""
        attempt = self.executor.attempts.get(job_id)
        if attempt is not None and attempt.job.epoch == epoch:
            self.cancel_attempt(job_id, epoch)

    @property
    def healthy(self) -> int:
        """Live workers not stuck in an attempt."""
        return self._healthy

    def stats(self) -> dict[str, int]:
        executor = self.executor
        busy = len(executor.attempts) + len(executor.lingering)  # a stuck worker's attempt is in neither
        return {
            "configured": self.size,
            "busy": busy,
            "idle": max(self._healthy - busy, 0),
            "healthy": self._healthy,
            "unhealthy": self._stuck,
            "replaced": self._replaced,
            "abandoned_threads": executor.threads.abandoned_running,
            "abandoned_threads_total": executor.threads.abandoned_total,
        }

    # -------------------------------------------------------------- workers

    async def _work(self, slot: int) -> None:
        me = _Worker(slot)
        self._healthy += 1
        self._workers.add(me)
        try:
            while await self._serve(me):
                pass
        except Exception as exc:  # handler errors never get here: only the store's
            self._crash(exc)
        except BaseException as exc:
            # Shutdown (or the caller) cut the attempt off: give its job back
            # uncounted, unless its outcome was already decided. The cancel
            # may come wrapped in a group (a handler's own nursery). A real
            # signal propagates as it is: the session releases running jobs.
            job, attempt = me.job, me.attempt
            if without_cancelled(exc) is None and job is not None and (attempt is None or not attempt.ended):
                if attempt is not None:
                    attempt.ended = True
                with trio.CancelScope(shield=True):
                    await self.completer.complete(Released(job.id, job.epoch), job, me.started)
            raise
        finally:
            if me.reporting and me.job is not None:  # cut off (shutdown): it only ends for its keys
                me.reporting = False
                self._report(me.job, None, me.trio_started)
            self._workers.discard(me)
            if me.stuck:
                self._stuck -= 1
            else:
                self._healthy -= 1
                if self.producer.stopping and self._healthy == 0:
                    self._drained.set()

    async def _serve(self, me: _Worker) -> bool:
        """Run attempts inside one cancel scope until a deadline or cancel spends it.

        Returns whether the worker should go on (with a fresh scope).
        """
        producer, executor, registry = self.producer, self.executor, self._registry
        with trio.CancelScope() as scope:
            while True:
                job = await producer.take()
                if job is None:
                    return False
                me.job = job
                task = me.task = registry.get(job.task)
                me.started = perf_counter()
                if self.observers:
                    me.wall_started = self._clock()
                if self._adaptive and job.limits:
                    me.trio_started = trio.current_time()
                    me.reporting = True
                    registry.limits.started(job.limits)
                debug = debug_enabled()
                if debug:
                    log_started(job)
                if task is not None and task.kind != "process":  # the hot path: one call less
                    outcome = await executor.attempt(me, scope, job, task)
                else:
                    outcome = await executor.run(me, scope, job, task)
                attempt = me.attempt
                # Only an attempt that had a deadline (a cancel sets one) can
                # have spent the scope; asking trio costs a clock read per job.
                if attempt is not None and attempt.deadline != math.inf and scope.cancel_called:
                    break  # settle outside the spent scope
                await self._settle(me, outcome, debug)
                if me.stuck:
                    return False
                # Handlers that never yield must not let one worker starve the
                # rest of the program; a checkpoint per job would cost as much
                # as the job itself, so take one every few jobs.
                me.unyielded += 1
                if me.unyielded >= _JOBS_PER_CHECKPOINT:
                    me.unyielded = 0
                    await trio.lowlevel.checkpoint()
        await self._settle(me, outcome, debug)
        return not me.stuck

    def _report(self, job: Job, outcome: Outcome | None, started: float) -> None:
        """Tell the adaptive keys ``job`` holds how its attempt ended: its latency and whether it failed.

        Only a failure that may be the dependency's counts: an error that will be retried (a
        timeout, a hang, ``Overloaded``, any exception). One that dooms the job whatever the
        dependency does (``NoRetry``, a task's ``no_retry``, an unknown task) does not, nor does a
        snooze (the handler chose to wait: no latency to learn from). ``None`` (decided elsewhere,
        or cut off) only ends the attempt.
        """
        now = trio.current_time()
        failed = isinstance(outcome, Failed)
        if (
            outcome is None
            or isinstance(outcome, Snoozed)
            or (isinstance(outcome, Failed) and outcome.retry_in is None)
        ):
            self._registry.limits.observe(job.limits, now, math.nan)
            return
        self._registry.limits.observe(job.limits, now, now - started, failed=failed)

    async def _settle(self, me: _Worker, outcome: Outcome | None, debug: bool = False) -> None:
        """Record the outcome of ``me``'s attempt (``None``: decided already) under its epoch;
        ``debug``: whether ``trioq`` logs at DEBUG (asked once per attempt)."""
        job, task = me.job, me.task
        assert job is not None
        if self.observers and task is not None:
            ran = self._clock() - me.wall_started
            for observer in self.observers:
                observer(task.name, max(me.wall_started - job.run_at, 0.0), ran)
        if me.reporting:
            me.reporting = False
            self._report(job, outcome, me.trio_started)
        try:
            if outcome is not None:
                completer = self.completer
                if completer.batched:
                    await completer.complete(outcome, job, me.started)
                else:  # inline, one call less: the hottest call of a drain
                    try:
                        state = (await self._store.complete((outcome,)))[0]
                    except BaseException as exc:
                        # Cut off (the grace ran out; the cancel may come in a group, from a store's
                        # own nursery) before the store may have applied it: the completer sends it
                        # again, shielded; one applied already is refused.
                        if without_cancelled(exc) is None:
                            await completer.complete(outcome, job, me.started)
                        raise
                    if state is _SUCCEEDED and not debug and type(outcome) is Succeeded:
                        self._totals.succeeded += 1  # Completer.count's first case, unrolled
                        self._on_outcome()
                    else:
                        completer.count(outcome, state, job, me.started)
        finally:
            executor = self.executor
            if executor.cancelled_claims:
                executor.cancelled_claims.discard((job.id, job.epoch))
            me.job = me.attempt = me.task = None

    # ------------------------------------------------------------- watchdog

    def _stuck_worker(self, attempt: Attempt) -> None:
        """The watchdog declared ``attempt``'s worker stuck: a replacement takes its slot."""
        worker: _Worker = attempt.worker
        worker.stuck = True
        self._healthy -= 1
        self._stuck += 1
        self._replaced += 1
        self._totals.stuck += 1
        if not self.producer.stopping:
            assert self._nursery is not None
            self._nursery.start_soon(self._work, worker.slot)
        elif self._healthy == 0:
            self._drained.set()

    async def _record_hung(self, outcome: Failed, attempt: Attempt) -> None:
        worker: _Worker = attempt.worker
        await self.completer.complete(outcome, attempt.job, worker.started)
