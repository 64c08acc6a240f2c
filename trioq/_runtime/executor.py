"""The executor: one attempt of a claimed job, in its worker's cancel scope, to a typed outcome.

:meth:`Executor.run` calls the job's handler its own way (inline for an async
handler, in a thread, or in a worker process), bounded by the attempt's
deadline, and says what became of the attempt as a
:data:`~trioq.stores.Outcome`: ``Succeeded`` with the result, ``Failed``
with the error, its traceback and when to retry (``None``: never, for
``trioq.NoRetry``, a task's ``no_retry`` types), or ``Snoozed``. A hang (the
deadline was a heartbeat's) runs again at once; a passed ``timeout`` backs off
as an error does (DESIGN.md section 4).

The executor also keeps the registry of attempts whose handler runs, which
the watchdog reads (to find stuck workers) and a cancel uses (to stop one).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from .._context import Attempt, JobContext
from .._model import Backoff, InvalidJob, Job, JobNotFound, JobState, NoRetry, Snooze, error_text
from .._registry import Registry, TaskDef
from .._validate import number
from ..stores._base import Failed, Outcome, Snoozed, Store, Succeeded
from .exits import SignalHandlers, attempt_failure, failure_text, leaves
from .runners import ProcessRunner, ThreadRunner
from .totals import Totals

__all__ = ["Executor"]

_DEFAULT_BACKOFF = Backoff()

_log = logging.getLogger("trioq")


class Executor:
    """Runs attempts for the pool's workers; see the module docstring.

    ``attempts`` maps a job id to its attempt while the handler runs;
    ``lingering`` holds attempts whose job runs again while their body still
    does (cancelled, shielded, then retried): no longer the job's, still the
    watchdog's. ``cancelled_claims`` holds ``(job id, epoch)`` of jobs
    cancelled after their claim, before their attempt started (waiting for a
    CPU, or for a fault plan's numbering).
    """

    def __init__(self, *, registry: Registry, heartbeat_timeout: float | None, processes: int, totals: Totals) -> None:
        self._registry = registry
        self._heartbeat_timeout = heartbeat_timeout
        self._totals = totals
        self._random = random.Random()
        self.threads = ThreadRunner()
        self.processes = ProcessRunner(processes)
        self._signals = SignalHandlers()  # the signal handlers seen since the pool started (see exits)
        self._token = trio.lowlevel.current_trio_token()
        self._trio_thread = threading.get_ident()
        #: Reads ``{parent_id: result}`` of the given parents (the pool sets it, from its store).
        self.read_parents: Callable[[tuple[str, ...]], Awaitable[dict[str, Any]]] = _no_parents
        self.attempts: dict[str, Attempt] = {}
        self.lingering: set[Attempt] = set()
        self.cancelled_claims: set[tuple[str, int]] = set()
        #: Called with each attempt's deadline as it starts (the watchdog's wake-up).
        self.on_deadline: Callable[[float], None] = _ignore

    async def run(self, worker: Any, scope: trio.CancelScope, job: Job, task: TaskDef | None) -> Outcome | None:
        """Run one attempt of ``job`` (its task ``task``, ``None`` if unknown) inside ``scope``.

        Returns its outcome, or ``None`` when the outcome was decided already
        (the watchdog declared the attempt stuck, or the job was cancelled).
        A cancel from outside the attempt (shutdown), or a real signal, is
        raised, not returned (see :mod:`trioq._runtime.exits`).
        """
        if task is None:
            return self._failed(job, None, error_text(self._registry.unknown(job.task)), None)
        if task.kind != "process":
            return await self.attempt(worker, scope, job, task)
        async with self.processes.cpus:  # wait for a CPU before the deadline starts
            return await self.attempt(worker, scope, job, task)

    async def attempt(self, worker: Any, scope: trio.CancelScope, job: Job, task: TaskDef) -> Outcome | None:
        """:meth:`run` for a known task whose handler is not a process's (the pool calls it directly)."""
        if self.cancelled_claims and (job.id, job.epoch) in self.cancelled_claims:
            # Its outcome would be refused: the job is cancelled already.
            return None
        attempt = Attempt(job, task, task.heartbeat_timeout_in(self._heartbeat_timeout), scope, worker)
        worker.attempt = attempt
        attempts = self.attempts
        previous = attempts.get(job.id)
        if previous is not None:  # its body still runs: it stays watched
            if previous.job.epoch == job.epoch:
                # The store gave the same claim twice: one attempt runs it.
                _log.error("job %s (%s) was claimed twice under epoch %d; it runs once", job.id, job.task, job.epoch)
                return None
            self.lingering.add(previous)
        attempts[job.id] = attempt
        if attempt.deadline != math.inf:
            scope.deadline = attempt.deadline
            self.on_deadline(attempt.deadline)
        attempt.in_handler = True
        try:
            if job.after:  # inside the attempt: a store that cannot answer fails it, to be retried
                attempt.parents = await self.read_parents(job.after)
            result = await self.invoke(worker, job, task, attempt)
        except BaseException as exc:
            # In a method of its own: a local here holding the exception
            # would keep it, its traceback and this frame in a cycle.
            return self._raised(exc, attempt, scope.cancel_called)
        finally:
            attempt.in_handler = False
            if scope.deadline != math.inf:
                scope.deadline = math.inf
            if attempts.get(job.id) is attempt:
                del attempts[job.id]
            elif self.lingering:
                self.lingering.discard(attempt)
        if attempt.ended:
            return None  # the watchdog or a cancel decided it already
        attempt.ended = True
        return Succeeded(job.id, job.epoch, result)

    async def invoke(self, worker: Any, job: Job, task: TaskDef, attempt: Attempt) -> Any:
        """Call the handler of ``task`` its own way (async, thread or process), inside the attempt.

        The one place a handler is called: a fault plan (``trioq.testing``)
        wraps this method of an executor to inject failures, hangs and delays.
        """
        kind = task.kind
        if kind == "async":
            return await task.fn(JobContext(job, attempt, self._token, self._trio_thread), **job.payload)
        if kind == "thread":
            ctx = JobContext(job, attempt, self._token, self._trio_thread)
            return await self.threads.call(task.fn, ctx, job.payload)
        return await self.processes.call(task.fn, attempt, worker.slot, job.payload)

    def _raised(self, exc: BaseException, attempt: Attempt, deadline_hit: bool) -> Outcome | None:
        """The outcome of an attempt whose handler raised ``exc`` (raises what must go on up)."""
        failure = attempt_failure(exc, deadline_hit, attempt.task.kind, self._signals)
        if attempt.ended:
            return None
        attempt.ended = True
        job, task = attempt.job, attempt.task
        found = leaves(failure) if failure is not None else []
        snoozed = len(found) == 1 and isinstance(found[0], Snooze)
        if failure is None or (snoozed and deadline_hit):
            # Its deadline stopped it (a snooze it raised on the way out
            # changes nothing: a timeout is a failure, as max_attempts counts).
            hung = attempt.missed_heartbeat
            if hung:
                self._totals.hung += 1
            else:
                self._totals.timed_out += 1
            return self._failed(job, task, attempt.deadline_error(), None, at_once=hung)
        if snoozed:
            return self._snoozed(job, task, found[0])
        no_retry = bool(found) and all(
            isinstance(leaf, NoRetry) or (task.no_retry and isinstance(leaf, task.no_retry)) for leaf in found
        )
        text = "".join(traceback.format_exception(failure))
        return self._failed(job, task, failure_text(failure), text, no_retry=no_retry)

    def _snoozed(self, job: Job, task: TaskDef, snooze: BaseException) -> Outcome:
        """A snooze, if its ``seconds`` is a number of seconds; else the attempt fails (counted)."""
        try:
            seconds = number("trioq.Snooze seconds", getattr(snooze, "seconds", None))
        except Exception as exc:  # anything the handler's value does while it is looked at
            problem = (
                exc if isinstance(exc, InvalidJob) else InvalidJob(f"trioq.Snooze needs seconds: {error_text(exc)}")
            )
            return self._failed(job, task, error_text(problem), None)
        return Snoozed(job.id, job.epoch, seconds)

    def _failed(
        self,
        job: Job,
        task: TaskDef | None,
        error: str,
        traceback_text: str | None,
        *,
        at_once: bool = False,
        no_retry: bool = False,
    ) -> Failed:
        """A failed attempt: runs again after its backoff, ``at_once`` (a hang: the wait for the
        missed heartbeat was the delay), or never (``no_retry``)."""
        if no_retry:
            retry_in: float | None = None
        elif at_once:
            retry_in = 0.0
        else:
            backoff = task.backoff if task is not None else _DEFAULT_BACKOFF
            retry_in = backoff.delay(job.attempts + 1, self._random.random())
        return Failed(job.id, job.epoch, error, retry_in, traceback_text)

    def hung(self, attempt: Attempt, error: str) -> Failed:
        """The outcome of ``attempt``, declared stuck by the watchdog (it has not returned)."""
        self._totals.hung += 1
        return self._failed(attempt.job, attempt.task, error, None, at_once=attempt.missed_heartbeat)

    def cancel_attempt(self, job_id: str, epoch: int) -> bool:
        """Stop the attempt running ``job_id`` under ``epoch`` (the job was cancelled).

        Returns whether a running attempt was stopped (the watchdog should
        look at its new deadline). A claim whose attempt has not started is
        the pool's to stop (it knows its workers' claims: see
        ``cancelled_claims``).
        """
        attempt = self.attempts.get(job_id)
        if attempt is None or attempt.job.epoch != epoch:
            return False
        attempt.ended = True  # the store already recorded the outcome: cancelled
        attempt.set_deadline(trio.current_time())
        attempt.scope.cancel()
        return True

    def live(self) -> list[Attempt]:
        """Every attempt whose handler runs and that is not declared stuck."""
        if self.lingering:
            return [*self.attempts.values(), *self.lingering]
        return list(self.attempts.values())


async def _no_parents(ids: tuple[str, ...]) -> dict[str, Any]:
    return {}


async def read_parents(store: Store, ids: Sequence[str]) -> dict[str, Any]:
    """``{parent_id: result}`` of the succeeded parents ``ids`` in ``store``, in that order: through
    the store's ``results(ids)`` if it offers one (one round trip), else a ``get`` per parent. A
    parent the store no longer holds (evicted before its child ran) is left out, with a warning."""
    results = getattr(store, "results", None)
    if results is not None:
        found: dict[str, Any] = await results(ids)
    else:
        found = {}
        for parent_id in ids:
            try:
                parent = await store.get(parent_id)
            except JobNotFound:
                continue
            if parent.state is JobState.SUCCEEDED:
                found[parent_id] = parent.result
    if len(found) < len(ids):
        gone = [p for p in ids if p not in found]
        _log.warning(
            "parents %s are gone from the store (evicted: a retention shorter than the flow); ctx.parents "
            "lacks their results",
            ", ".join(gone),
        )
    return {p: found[p] for p in ids if p in found}


def _ignore(deadline: float) -> None:
    pass
