"""What a node logs about its jobs: the stdlib logger ``trioq``, with structured ``extra`` fields.

Levels: an attempt's start and a success at ``DEBUG``; a failed attempt that
will run again (errors, hangs, timeouts) at ``WARNING`` with its traceback; a
job that died (attempts used up, ``NoRetry``, an unstorable result, a
snooze past the limit) at ``ERROR``; a snooze at ``DEBUG``; rescued jobs and
stuck workers at ``WARNING`` (see the watchdog and maintenance). Nothing is
configured here: with Python's defaults, warnings and errors reach stderr and
the rest is dropped.

Every record about one attempt carries, as attributes of the ``LogRecord``
(``extra``): ``job_id``, ``task``, ``attempt`` (1-based), ``epoch``,
``queue`` and ``duration`` (seconds the attempt took, measured with
``time.perf_counter``: real time, also under a mock clock); a failure also
``error``. A JSON log formatter can take them as they are.
"""

from __future__ import annotations

import functools
import logging
import sys
import traceback
from time import perf_counter
from typing import Any

from .._model import Job, JobState
from ..stores._base import Failed, Outcome, Snoozed, Succeeded

__all__ = ["debug_enabled", "emit", "job_fields", "log_outcome", "log_started"]

log = logging.getLogger("trioq")

_DEAD = JobState.DEAD


#: Whether ``trioq`` logs at ``DEBUG``, asked per job (the logger caches the answer; a partial
#: saves a Python call on the hot path).
debug_enabled = functools.partial(log.isEnabledFor, logging.DEBUG)


def job_fields(job: Job, **more: Any) -> dict[str, Any]:
    """The ``extra`` fields naming ``job``'s attempt (as claimed: ``attempt`` is the one that runs)."""
    return {
        "job_id": job.id,
        "task": job.task,
        "attempt": job.attempts + 1,
        "epoch": job.epoch,
        "queue": job.queue,
    } | more


def emit(level: int, message: str, *args: Any, extra: dict[str, Any]) -> None:
    """``log.log(level, ...)``, except that a handler or filter of the application's that raises
    cannot stop the queue: the error is printed to stderr, as ``logging`` itself does for a
    handler's error (when ``logging.raiseExceptions``), and the job's outcome stands."""
    try:
        log.log(level, message, *args, extra=extra)
    except Exception:
        if logging.raiseExceptions:
            sys.stderr.write("--- trioq: a logging handler or filter raised (the job is unaffected) ---\n")
            traceback.print_exc(file=sys.stderr)


def log_started(job: Job) -> None:
    """``DEBUG``: an attempt of ``job`` starts."""
    emit(logging.DEBUG, "job %s (%s) attempt %d started", job.id, job.task, job.attempts + 1, extra=job_fields(job))


def log_outcome(job: Job, outcome: Outcome, state: JobState, started: float) -> None:
    """Log the applied ``outcome`` of ``job``'s attempt, which began at ``started``
    (``perf_counter()``); ``state`` is the job's state after it."""
    duration = perf_counter() - started
    fields = job_fields(job, duration=duration)
    attempt = job.attempts + 1
    if type(outcome) is Succeeded and state is not _DEAD:
        emit(logging.DEBUG, "job %s (%s) succeeded in %.3fs", job.id, job.task, duration, extra=fields)
        return
    if type(outcome) is Snoozed and state is not _DEAD:
        emit(logging.DEBUG, "job %s (%s) snoozed for %gs", job.id, job.task, outcome.delay, extra=fields)
        return
    if type(outcome) is Failed:
        error = outcome.error
    elif type(outcome) is Succeeded:
        error = "InvalidJob: its result cannot be stored (the job's error says why)"
    else:
        error = "SnoozeLimit: it snoozed too many times"
    trace = outcome.traceback if type(outcome) is Failed else None
    fields["error"] = error
    shown = f"{error}\n{trace.rstrip()}" if trace else error
    if state is _DEAD:
        emit(logging.ERROR, "job %s (%s) is dead after attempt %d: %s", job.id, job.task, attempt, shown, extra=fields)
    else:
        retry_in = outcome.retry_in if type(outcome) is Failed else None
        again = "at once" if not retry_in else f"in {retry_in:.3g}s"
        message = "job %s (%s) attempt %d failed, runs again %s: %s"
        emit(logging.WARNING, message, job.id, job.task, attempt, again, shown, extra=fields)
