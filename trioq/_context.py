"""What a handler sees of its attempt: the job and a way to say it is alive."""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING, Any

import trio

from ._model import Job

if TYPE_CHECKING:
    from ._registry import TaskDef

__all__ = ["Attempt", "JobContext"]

_NO_PARENTS: dict[str, Any] = {}


class Attempt:
    """One run of one job by one worker, and the deadline that bounds it.

    The deadline is the earlier of ``started + timeout`` and the last heartbeat
    plus ``heartbeat_timeout`` (``inf`` without either); :meth:`beat` moves it.
    ``scope`` is the worker's cancel scope: while the handler runs
    (``in_handler``), its deadline is this attempt's. Workers reuse one scope
    across attempts until something cancels it, because entering a fresh
    ``trio.CancelScope`` per attempt costs more than a whole no-op job. Only the
    trio thread touches this object (thread handlers reach it through
    :meth:`JobContext.heartbeat`, which hops to trio).
    """

    __slots__ = (
        "deadline", "ended", "heartbeat_timeout", "in_handler", "job", "parents", "scope", "task", "timeout_at",
        "worker",
    )  # fmt: skip

    def __init__(
        self, job: Job, task: TaskDef, heartbeat_timeout: float | None, scope: trio.CancelScope, worker: Any = None
    ) -> None:
        self.job = job
        #: The worker running this attempt (the pool's own record of it).
        self.worker = worker
        self.task = task
        self.scope = scope
        self.heartbeat_timeout = heartbeat_timeout
        if task.timeout is None and heartbeat_timeout is None:
            self.timeout_at = self.deadline = math.inf
        else:
            now = trio.current_time()
            self.timeout_at = now + task.timeout if task.timeout is not None else math.inf
            self.deadline = self.timeout_at
            if heartbeat_timeout is not None:
                self.deadline = min(self.deadline, now + heartbeat_timeout)
        #: Set once the attempt's outcome is decided (by its worker, the watcher, or a cancel).
        self.ended = False
        self.in_handler = False
        #: ``{parent_id: result}`` of the job's parents, read before the handler runs.
        self.parents: dict[str, Any] = _NO_PARENTS

    def set_deadline(self, deadline: float) -> None:
        """Move the deadline (and the scope's, while the handler runs)."""
        self.deadline = deadline
        if self.in_handler:
            self.scope.deadline = deadline

    def beat(self) -> bool:
        """Push the heartbeat deadline out; False once the attempt has ended or its deadline passed.

        A beat after the deadline comes too late: the attempt is being
        stopped, and what stops it (a hang or a timeout) stays as it was.
        """
        if self.ended:
            return False
        now = trio.current_time()
        if now >= self.deadline:
            return False
        if self.heartbeat_timeout is not None:
            self.set_deadline(min(self.timeout_at, now + self.heartbeat_timeout))
        return True

    @property
    def missed_heartbeat(self) -> bool:
        """Whether the deadline now is the heartbeat's (earlier than the timeout's): a hang, if it passes."""
        return self.deadline < self.timeout_at

    def deadline_error(self) -> str:
        """The error text for an attempt stopped by its deadline: timed out, or hung."""
        if not self.missed_heartbeat:
            return f"AttemptTimeout: attempt timed out after {self.task.timeout:g}s"
        return f"AttemptHung: attempt hung: no heartbeat for {self.heartbeat_timeout:g}s"


class JobContext:
    """The first argument of every handler.

    ``ctx.job`` is the :class:`~trioq.Job` as claimed (``ctx.job.attempts`` is
    the number of earlier attempts; ``ctx.attempt`` is this one's 1-based
    number). ``ctx.heartbeat()`` tells the queue the attempt is alive, pushing
    its heartbeat deadline out; it is safe to call from a thread handler and
    returns ``False`` once the attempt has ended (hung, timed out, cancelled),
    which a long thread handler can take as its cue to stop. ``ctx.parents``
    is ``{parent_id: result}`` for the job's parents (``{}`` without any).
    """

    __slots__ = ("_attempt", "_token", "_trio_thread", "job")

    def __init__(
        self,
        job: Job,
        attempt: Attempt,
        token: trio.lowlevel.TrioToken | None = None,
        trio_thread: int | None = None,
    ) -> None:
        self.job = job
        self._attempt = attempt
        # The worker pool passes both in (they are the same for every job).
        self._token = trio.lowlevel.current_trio_token() if token is None else token
        self._trio_thread = threading.get_ident() if trio_thread is None else trio_thread

    @property
    def attempt(self) -> int:
        """This attempt's 1-based number."""
        return self.job.attempts + 1

    @property
    def parents(self) -> dict[str, Any]:
        """``{parent_id: result}`` of each parent in ``job.after``, in that order (a fresh dict per
        attempt: changing it changes nothing stored). A parent evicted before the job ran (its
        retention shorter than the flow) is missing from it, and the queue logs a warning."""
        return self._attempt.parents

    def heartbeat(self) -> bool:
        """Say the attempt is alive; ``False`` if it already ended (stop working then)."""
        if threading.get_ident() == self._trio_thread:
            return self._attempt.beat()
        try:
            return trio.from_thread.run_sync(self._attempt.beat, trio_token=self._token)
        except trio.RunFinishedError:
            # The queue's trio run is over, so this attempt certainly ended.
            return False

    def __repr__(self) -> str:
        return f"<JobContext job={self.job.id} task={self.job.task!r} attempt={self.attempt}>"
