"""The worker pool: workers that claim and run attempts, and the health watcher.

Each worker loops: claim a job from the store (parking when none is ready),
run one attempt inside the attempt's cancel scope, record the outcome under
the epoch it claimed. The health watcher sleeps until the earliest attempt
deadline plus :data:`STUCK_GRACE`; a worker still inside an attempt by then
(shielded code, a handler that swallows cancellation) is declared stuck: its
job is failed as hung (and so requeued under a new epoch at its next claim;
at once when the deadline was a heartbeat's, after the backoff when it was the
timeout's), and a replacement worker takes its slot. The stuck task exits when it finally
returns, its late outcome refused by the epoch check. So at most ``size``
attempts are ever live.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._context import Attempt, JobContext
from .._model import Backoff, InvalidJob, Job, JobState, error_text
from .._registry import Registry, TaskDef
from ..stores._base import Store
from .exits import DEADLINE, SignalHandlers, attempt_error, without_cancelled
from .runners import ProcessRunner, ThreadRunner

if TYPE_CHECKING:
    from .._testing.faults import FaultSession

__all__ = ["STUCK_GRACE", "Totals", "WorkerPool"]

#: Seconds an attempt may run past its deadline before its worker is declared stuck.
#: Cancellable handlers return within microseconds of the deadline; only code
#: that shields itself from cancellation gets near this.
STUCK_GRACE = 1.0

_DEFAULT_BACKOFF = Backoff()


@attrs.define
class Totals:
    """Counters since the queue opened (see :meth:`Queue.stats`)."""

    enqueued: int = 0
    succeeded: int = 0
    failed_attempts: int = 0
    retried: int = 0
    dead: int = 0
    timed_out: int = 0
    hung: int = 0
    stuck: int = 0
    cancelled: int = 0
    released: int = 0


@attrs.define(eq=False)
class _Worker:
    """One worker task's state: the job it holds (claimed, not yet settled)."""

    slot: int
    started: float = 0.0  # wall-clock start of the current attempt (kept only for observers)
    job: Job | None = None
    task: TaskDef | None = None
    attempt: Attempt | None = None
    stuck: bool = False
    unyielded: int = 0


#: A worker checkpoints after this many jobs in a row (see _serve).
_JOBS_PER_CHECKPOINT = 4


class WorkerPool:
    """``size`` workers sharing one store, plus the watcher that replaces stuck ones.

    ``clock`` is the wall clock the store uses; ``on_outcome()`` is called
    after every attempt outcome recorded (success, failure, death): how a
    waiter hears of a terminal job is the store's (``StoreConfig.on_finished``).
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
    ) -> None:
        self.size = size
        self._registry = registry
        self._store = store
        self._heartbeat_timeout = heartbeat_timeout
        self._clock = clock
        self._totals = totals
        self._on_outcome = on_outcome
        self._random = random.Random()
        self._threads = ThreadRunner()
        self._processes = ProcessRunner(size)
        self._lot = trio.lowlevel.ParkingLot()
        self._ready_generation = 0
        self._stopping = False
        self._attempts: dict[str, Attempt] = {}  # by job id, while the handler runs
        # Attempts whose job runs again while their body still does (cancelled,
        # shielded, then retried): no longer the job's, still the watcher's.
        self._lingering: set[Attempt] = set()
        # The signal handlers seen since the pool started (see trioq._runtime.exits).
        self._signals = SignalHandlers()
        # (job id, epoch) of jobs cancelled after their claim, before their
        # attempt started (waiting for a CPU, or for a fault plan's numbering).
        self._cancelled_claims: set[tuple[str, int]] = set()
        self._healthy = 0
        self._stuck = 0
        self._replaced = 0
        self._drained = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._watch_at = math.inf
        self._watch_scope: trio.CancelScope | None = None
        self._fatal: Exception | None = None
        #: Called as ``observer(task, queue_wait_s, run_s)`` after each attempt.
        self.observers: list[Callable[[str, float, float], None]] = []
        self._token = trio.lowlevel.current_trio_token()
        self._trio_thread = threading.get_ident()
        self._fatal_notes: set[str] = set()
        #: A fault plan applied to this queue's attempts (trioq.testing), if any.
        self.faults: FaultSession | None = None

    # ------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the workers and the watcher until :meth:`cancel` (or the caller) stops them."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._watch_loop)
                for slot in range(self.size):
                    nursery.start_soon(self._work, slot)
                if self.size == 0:
                    self._drained.set()
                task_status.started()
        finally:
            self._processes.close()
        if self._fatal is not None:
            raise self._fatal

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
        """The store's wake-up signal: ``n`` jobs may have become claimable."""
        self._ready_generation += 1
        self._lot.unpark(count=n)

    def stop_claiming(self) -> None:
        """Let busy workers finish their attempt, then exit; idle ones exit now."""
        self._stopping = True
        self._lot.unpark_all()
        if self._healthy == 0:
            self._drained.set()

    async def wait_drained(self) -> None:
        """Until every healthy worker has exited (after :meth:`stop_claiming`)."""
        await self._drained.wait()

    def cancel(self) -> None:
        """Cancel everything: running attempts release their jobs as they unwind."""
        self._stopping = True
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def cancel_attempt(self, job_id: str, epoch: int) -> None:
        """Stop the attempt running ``job_id`` under ``epoch`` (the job was cancelled)."""
        attempt = self._attempts.get(job_id)
        if attempt is None or attempt.job.epoch < epoch:
            # Claimed (the store says running) but not started yet (an older
            # attempt of the job may linger): the worker holding the claim
            # checks this before the handler runs.
            self._cancelled_claims.add((job_id, epoch))
            return
        if attempt.job.epoch != epoch:
            return
        attempt.ended = True  # the store already recorded the outcome: cancelled
        attempt.set_deadline(trio.current_time())
        attempt.scope.cancel()
        self._watch(attempt.deadline)

    @property
    def healthy(self) -> int:
        """Live workers not stuck in an attempt."""
        return self._healthy

    def stats(self) -> dict[str, int]:
        busy = len(self._attempts) + len(self._lingering)  # a stuck worker's attempt is in neither
        return {
            "configured": self.size,
            "busy": busy,
            "idle": max(self._healthy - busy, 0),
            "healthy": self._healthy,
            "unhealthy": self._stuck,
            "replaced": self._replaced,
            "abandoned_threads": self._threads.abandoned_running,
            "abandoned_threads_total": self._threads.abandoned_total,
        }

    # -------------------------------------------------------------- workers

    async def _work(self, slot: int) -> None:
        me = _Worker(slot)
        self._healthy += 1
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
                    if await self._store.release(job.id, job.epoch) is not None:
                        self._totals.released += 1
            raise
        finally:
            if me.stuck:
                self._stuck -= 1
            else:
                self._healthy -= 1
                if self._stopping and self._healthy == 0:
                    self._drained.set()

    async def _serve(self, me: _Worker) -> bool:
        """Run attempts inside one cancel scope until a deadline or cancel spends it.

        Returns whether the worker should go on (with a fresh scope).
        """
        with trio.CancelScope() as scope:
            while True:
                job = await self._next_job()
                if job is None:
                    return False
                me.job = job
                if self.faults is not None:
                    # Numbered at its claim, before any deadline runs: the
                    # number must not depend on waiting for a CPU.
                    await self.faults.number(job.id)
                task = me.task = self._registry.get(job.task)
                if task is not None and task.kind != "process":
                    result, error = await self._run_handler(me, scope, job, task)
                else:
                    result, error = await self._attempt_elsewhere(me, scope, job, task)
                attempt = me.attempt
                # Only an attempt that had a deadline (a cancel sets one) can
                # have spent the scope; asking trio costs a clock read per job.
                if attempt is not None and attempt.deadline != math.inf and scope.cancel_called:
                    break  # settle outside the spent scope
                await self._settle(me, result, error)
                if me.stuck:
                    return False
                # Handlers that never yield must not let one worker starve the
                # rest of the program; a checkpoint per job would cost as much
                # as the job itself, so take one every few jobs.
                me.unyielded += 1
                if me.unyielded >= _JOBS_PER_CHECKPOINT:
                    me.unyielded = 0
                    await trio.lowlevel.checkpoint()
        await self._settle(me, result, error)
        return not me.stuck

    async def _next_job(self) -> Job | None:
        store = self._store
        while not self._stopping:
            generation = self._ready_generation
            job = await store.claim()
            if job is not None:
                if self._stopping:
                    with trio.CancelScope(shield=True):
                        await store.release(job.id, job.epoch)
                    return None
                return job
            if generation == self._ready_generation and not self._stopping:
                await self._lot.park()
        return None

    async def _attempt_elsewhere(
        self, me: _Worker, scope: trio.CancelScope, job: Job, task: TaskDef | None
    ) -> tuple[Any, str | None]:
        """An attempt that is not a plain handler call: a process, or an unknown task."""
        if task is None:
            return None, error_text(self._registry.unknown(job.task))
        async with self._processes.cpus:  # wait for a CPU before the deadline starts
            return await self._run_handler(me, scope, job, task)

    async def _run_handler(
        self, me: _Worker, scope: trio.CancelScope, job: Job, task: TaskDef
    ) -> tuple[Any, str | None]:
        if self._cancelled_claims and (job.id, job.epoch) in self._cancelled_claims:
            return None, "JobCancelled: the job was cancelled before its attempt started"  # refused at settle
        heartbeat_timeout = task.heartbeat_timeout_in(self._heartbeat_timeout)
        if self.observers:
            me.started = self._clock()
        attempt = Attempt(job, task, heartbeat_timeout, scope, me)
        me.attempt = attempt
        previous = self._attempts.get(job.id)
        if previous is not None:  # its body still runs: it stays watched
            self._lingering.add(previous)
        self._attempts[job.id] = attempt
        if attempt.deadline != math.inf:
            scope.deadline = attempt.deadline
            self._watch(attempt.deadline)
        attempt.in_handler = True
        try:
            if self.faults is not None:
                return await self.faults.attempt(job, lambda: self._call(me, job, task, attempt)), None
            if task.kind == "async":  # the hot path, inline: a call less per job
                return await task.fn(JobContext(job, attempt, self._token, self._trio_thread), **job.payload), None
            return await self._call(me, job, task, attempt), None
        except BaseException as exc:
            # In a function of its own: a local here holding the exception
            # would keep it, its traceback and this frame in a cycle.
            return None, attempt_error(exc, scope.cancel_called, task.kind, self._signals)
        finally:
            attempt.in_handler = False
            if scope.deadline != math.inf:
                scope.deadline = math.inf
            if self._attempts.get(job.id) is attempt:
                del self._attempts[job.id]
            elif self._lingering:
                self._lingering.discard(attempt)

    async def _call(self, me: _Worker, job: Job, task: TaskDef, attempt: Attempt) -> Any:
        """Call the handler of ``task`` its own way (async, thread or process)."""
        kind = task.kind
        if kind == "async":
            return await task.fn(JobContext(job, attempt, self._token, self._trio_thread), **job.payload)
        if kind == "thread":
            ctx = JobContext(job, attempt, self._token, self._trio_thread)
            return await self._threads.call(task.fn, ctx, job.payload)
        return await self._processes.call(task.fn, attempt, me.slot, job.payload)

    async def _settle(self, me: _Worker, result: Any, error: str | None) -> None:
        """Record the outcome of ``me``'s attempt under its epoch, unless already decided."""
        job, attempt, task = me.job, me.attempt, me.task
        assert job is not None
        hung = False  # stopped by a missed heartbeat: runs again at once
        if self.observers and task is not None:
            now = self._clock()
            for observer in self.observers:
                observer(task.name, max(me.started - job.run_at, 0.0), now - me.started)
        try:
            if attempt is not None:
                if attempt.ended:
                    return  # the watcher or a cancel already decided it
                attempt.ended = True
                if error is DEADLINE:
                    hung = attempt.missed_heartbeat
                    error = attempt.deadline_error()
                    if hung:
                        self._totals.hung += 1
                    else:
                        self._totals.timed_out += 1
            if error is None:
                # The worker moves on without waiting for the record to be
                # durable; the log commits it with others, soon. Whoever is
                # told of the outcome (Queue.get, wait, join) syncs first.
                try:
                    succeeded = await self._store.succeed(job.id, job.epoch, result, durable=False)
                except InvalidJob as exc:  # a result the store cannot hold: nothing changed
                    error = error_text(exc)
                else:
                    if succeeded:
                        self._totals.succeeded += 1
                        self._on_outcome()
            if error is not None:
                await self._fail(job, task, error, at_once=hung)
        finally:
            if self._cancelled_claims:
                self._cancelled_claims.discard((job.id, job.epoch))
            me.job = me.attempt = me.task = None

    async def _fail(self, job: Job, task: TaskDef | None, error: str, *, at_once: bool = False) -> None:
        """Record a failed attempt; the job runs again after its backoff, or ``at_once`` (a hang:
        the wait for the missed heartbeat was the delay, DESIGN.md section 4)."""
        if at_once:
            delay = 0.0
        else:
            backoff = task.backoff if task is not None else _DEFAULT_BACKOFF
            delay = backoff.delay(job.attempts + 1, self._random.random())
        failed = await self._store.fail(job.id, job.epoch, error, self._clock() + delay)
        if failed is None:
            return
        self._totals.failed_attempts += 1
        if failed.state is JobState.DEAD:
            self._totals.dead += 1
        else:
            self._totals.retried += 1
        self._on_outcome()

    # -------------------------------------------------------------- watcher

    def _live(self) -> list[Attempt]:
        """Every attempt whose handler runs and that is not declared stuck."""
        if self._lingering:
            return [*self._attempts.values(), *self._lingering]
        return list(self._attempts.values())

    def _watch(self, deadline: float) -> None:
        """Make sure the watcher wakes by ``deadline + STUCK_GRACE``."""
        at = deadline + STUCK_GRACE
        if at < self._watch_at:
            self._watch_at = at
            if self._watch_scope is not None:
                self._watch_scope.deadline = at

    async def _watch_loop(self) -> None:
        try:
            await self._watch_forever()
        except Exception as exc:
            self._crash(exc)

    async def _watch_forever(self) -> None:
        """Declare every attempt past its deadline plus :data:`STUCK_GRACE` stuck, then sleep.

        Declaring one awaits the store, and meanwhile workers start attempts
        (a replacement among them) and register their deadlines with
        :meth:`_watch`. So after any await the attempts are looked at again,
        and the time to wake is computed from them with no await between that
        and the sleep: a deadline registered at any moment is either in that
        computation or moves the sleep's scope itself.
        """
        while True:
            now = trio.current_time()
            overdue = [a for a in self._live() if now >= a.deadline + STUCK_GRACE]
            if overdue:
                for attempt in overdue:
                    await self._declare_stuck(attempt)
                continue
            self._watch_at = min((a.deadline for a in self._live()), default=math.inf) + STUCK_GRACE
            with trio.CancelScope(deadline=self._watch_at) as self._watch_scope:
                await trio.sleep_forever()
            self._watch_scope = None

    async def _declare_stuck(self, attempt: Attempt) -> None:
        """Give ``attempt``'s slot to a replacement worker and fail its job as hung.

        Only an attempt still registered is declared (it may have returned,
        or been declared already, while the watcher awaited the store); the
        bookkeeping is done before the store call, in one synchronous step.
        """
        job, worker = attempt.job, attempt.worker
        if self._attempts.get(job.id) is attempt:
            del self._attempts[job.id]
        elif attempt in self._lingering:
            self._lingering.remove(attempt)
        else:
            return
        worker.stuck = True
        self._healthy -= 1
        self._stuck += 1
        self._replaced += 1
        self._totals.stuck += 1
        if not self._stopping:
            assert self._nursery is not None
            self._nursery.start_soon(self._work, worker.slot)
        elif self._healthy == 0:
            self._drained.set()
        if not attempt.ended:
            attempt.ended = True
            self._totals.hung += 1
            await self._fail(
                job,
                attempt.task,
                f"AttemptHung: attempt still running {STUCK_GRACE:g}s after its deadline "
                "(shielded from cancellation, or blocked in a call that ignores it); its worker was replaced",
                at_once=attempt.missed_heartbeat,
            )
