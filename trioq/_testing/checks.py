"""Checks for tests of apps that use trioq (re-exported by ``trioq.testing``)."""

from __future__ import annotations

from .._model import JobState
from .._runtime.queue import Queue

__all__ = ["assert_all_terminal", "crash_points"]

_PENDING = (JobState.READY, JobState.SCHEDULED, JobState.RUNNING)


async def assert_all_terminal(queue: Queue, *, show: int = 20) -> None:
    """Raise ``AssertionError`` unless every job of ``queue`` is terminal now.

    Terminal means succeeded, dead or cancelled. The message counts the jobs
    still ready, scheduled or running and lists up to ``show`` of them (id,
    task, state, attempts, last error). It checks; it does not wait: call
    ``await queue.join()`` first to let work finish.
    """
    counts = await queue.store.counts()
    pending = {state.value: counts[state.value] for state in _PENDING if counts[state.value]}
    if not pending:
        return
    summary = ", ".join(f"{n} {state}" for state, n in pending.items())
    lines = [f"not every job is terminal: {summary}"]
    for job in await queue.store.jobs(_PENDING, limit=show):
        error = f", last error {job.error!r}" if job.error else ""
        lines.append(f"  {job.id} {job.task!r} {job.state.value}, {job.attempts} attempt(s){error}")
    hidden = sum(pending.values()) - (len(lines) - 1)
    if hidden > 0:
        lines.append(f"  ... and {hidden} more")
    raise AssertionError("\n".join(lines))


def crash_points(n: int) -> list[int]:
    """The crash points ``1..n``, to parametrize a test over ``FaultPlan.crash(after_records=...)``.

    Pick ``n`` from a run without a crash: ``plan.records`` holds how many log
    records the queue wrote. A point past the end of the run just never fires.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"crash_points needs an int n >= 1, got {n!r}")
    return list(range(1, n + 1))
