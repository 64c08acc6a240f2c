"""A reference model of a store: what every call must do to the jobs, in plain Python.

Written from the protocol's documentation (:mod:`trioq.stores._base`), not
from any store's code, so that the model-based run compares a store against
an independent account of the rules. It knows no ids until the store hands
them out, and keeps what it cannot predict exactly (an error text the store
writes itself, an epoch that may grow) as a looser expectation.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import attrs

from ..._model import MAX_ERRORS_KEPT, MAX_SNOOZES, Job, JobState
from .._base import Failed, NewJob, Outcome, Released, Snoozed, Succeeded

__all__ = ["ModelAttempt", "ModelJob", "Reference", "Text"]

_R, _S, _RUN = JobState.READY, JobState.SCHEDULED, JobState.RUNNING
_W, _DEAD, _CANCELLED = JobState.WAITING, JobState.DEAD, JobState.CANCELLED


@attrs.frozen
class Text:
    """An error text as expected: ``exact``, or (for a text the store writes) one holding ``part``."""

    exact: str | None = None
    part: str | None = None

    def matches(self, text: str | None) -> bool:
        """Whether ``text`` is what is expected."""
        if text is None:
            return False
        if self.exact is not None:
            return text == self.exact
        assert self.part is not None
        return self.part.lower() in text.lower()


@attrs.define
class ModelAttempt:
    """One failed attempt as ``Job.errors`` must hold it."""

    attempt: int
    error: Text
    traceback: str | None
    finished_at: float


@attrs.define
class ModelJob:
    """What the model knows of one job."""

    id: str
    task: str
    payload: dict[str, Any]
    priority: int
    key: str | None
    max_attempts: int
    created_at: float
    seq: int
    state: JobState
    run_at: float
    attempts: int = 0
    epoch: int = 0
    #: The store may have given the job a larger epoch (a release at a session's end, a retry).
    epoch_may_grow: bool = False
    finished_at: float | None = None
    result: Any = None
    error: Text | None = None
    errors: list[ModelAttempt] = attrs.field(factory=list)
    snoozes: int = 0
    #: The node whose claim runs the job.
    node: str | None = None
    #: Its parents' ids, and the parent whose death or cancel cancelled it.
    after: tuple[str, ...] = ()
    cancelled_by: str | None = None

    def problems(self, job: Job) -> list[str]:
        """How the store's snapshot ``job`` differs from the model (nothing: ``[]``); adopts a grown epoch."""
        found: list[str] = []

        def differs(what: str, expected: object, actual: object) -> None:
            if expected != actual:
                found.append(f"job {self.id}: {what} is {actual!r}, expected {expected!r}")

        differs("state", self.state, job.state)
        differs("attempts", self.attempts, job.attempts)
        if self.epoch_may_grow and job.epoch >= self.epoch:
            self.epoch = job.epoch
            self.epoch_may_grow = False
        differs("epoch", self.epoch, job.epoch)
        differs("fields", (self.task, self.payload, self.priority, self.key, self.max_attempts), job_fields(job))
        differs("created_at", self.created_at, job.created_at)
        differs("run_at", self.run_at, job.run_at)
        differs("finished_at", self.finished_at, job.finished_at)
        differs("result", self.result, job.result)
        differs("after", self.after, job.after)
        if self.error is None:
            differs("error", None, job.error)
        elif not self.error.matches(job.error):
            found.append(f"job {self.id}: error is {job.error!r}, expected {self.error}")
        expected = [(e.attempt, e.traceback, e.finished_at) for e in self.errors]
        differs("errors", expected, [(e.attempt, e.traceback, e.finished_at) for e in job.errors])
        for mine, theirs in zip(self.errors, job.errors, strict=False):
            if not mine.error.matches(theirs.error):
                found.append(f"job {self.id}: errors[{mine.attempt}] is {theirs.error!r}, expected {mine.error}")
        return found


def job_fields(job: Job) -> tuple[str, dict[str, Any], int, str | None, int]:
    """The fields a job keeps from its enqueue to its eviction."""
    return (job.task, job.payload, job.priority, job.key, job.max_attempts)


class Reference:
    """Every job a store should hold, and what each call should do to them.

    Terminal jobs are kept in the order they finished (``retained``), up to
    ``max_retained`` of them (the oldest goes as a newer one finishes) and
    until :meth:`evict` finds them ``retention`` seconds old.
    """

    def __init__(self, *, retention: float, max_retained: int, bound_at_evict: bool = False) -> None:
        self.retention = retention
        self.max_retained = max_retained
        #: The store applies ``max_retained`` in :meth:`evict` only (see ``StoreKind.bound_at_evict``).
        self.bound_at_evict = bound_at_evict
        #: Every retained job, in enqueue order.
        self.jobs: dict[str, ModelJob] = {}
        self.keys: dict[str, str] = {}
        self.retained: list[str] = []
        #: Ids the store handed out and has since dropped (evicted, or past ``max_retained``).
        self.dropped: set[str] = set()
        self._seq = 0

    # ------------------------------------------------------------------ add

    def would_refuse(self, specs: Sequence[NewJob], max_pending: int | None) -> bool:
        """Whether ``add(specs, max_pending=...)`` must raise ``QueueFull``."""
        if max_pending is None:
            return False
        counted = [spec for i, spec in enumerate(specs) if not self._will_wait(specs, i)]
        new_keys = {spec.key for spec in counted if spec.key is not None and spec.key not in self.keys}
        fresh = len(new_keys) + sum(1 for spec in counted if spec.key is None)
        return fresh > 0 and self.pending() + fresh > max_pending

    def unknown_parent(self, specs: Sequence[NewJob]) -> bool:
        """Whether a spec of ``specs`` names by id a parent the store does not hold (``InvalidJob``)."""
        return any(type(p) is str and p not in self.jobs for spec in specs for p in spec.after)

    def _will_wait(self, specs: Sequence[NewJob], index: int) -> bool:
        """Whether the job of ``specs[index]`` is added waiting (or cancelled), so not pending."""
        for parent in specs[index].after:
            if type(parent) is int:
                key = specs[parent].key
                held = self.keys.get(key) if key is not None else None
                if held is None or self.jobs[held].state is not JobState.SUCCEEDED:
                    return True
            elif self.jobs[str(parent)].state is not JobState.SUCCEEDED:
                return True
        return False

    def _blocker(self, job: ModelJob, besides: str | None = None) -> ModelJob | None:
        """The first parent of ``job`` (not ``besides``) held and dead or cancelled."""
        for parent_id in job.after:
            parent = self.jobs.get(parent_id)
            if parent_id != besides and parent is not None and parent.state in (_DEAD, _CANCELLED):
                return parent
        return None

    def _unmet(self, job: ModelJob) -> bool:
        """Whether a held parent of ``job`` has not succeeded (a dropped one ended long ago)."""
        return any(p in self.jobs and self.jobs[p].state is not JobState.SUCCEEDED for p in job.after)

    def _children(self, parent_id: str) -> list[ModelJob]:
        return [job for job in self.jobs.values() if parent_id in job.after]

    def add(self, specs: Sequence[NewJob], answered: Sequence[Job], now: float) -> list[str]:
        """Apply an accepted ``add``; ``answered`` is what the store returned. Returns what differs."""
        found: list[str] = []
        if len(answered) != len(specs):
            return [f"add of {len(specs)} jobs answered {len(answered)}"]
        ids = [job.id for job in answered]
        for spec, job in zip(specs, answered, strict=True):
            held = self.keys.get(spec.key) if spec.key is not None else None
            if held is not None:
                if job.id != held:
                    found.append(f"key {spec.key!r} is held by {held}, but add answered {job.id}")
                else:
                    found.extend(self.jobs[held].problems(job))
                continue
            if job.id in self.jobs or job.id in self.dropped:
                found.append(f"add answered the id {job.id} of another job for a new one")
                continue
            run_at = now + spec.delay
            state = _S if run_at > now else _R
            model = ModelJob(
                job.id, spec.task, dict(spec.payload), spec.priority, spec.key, spec.max_attempts, now, self._seq,
                state, run_at,
            )  # fmt: skip
            self._seq += 1
            self.jobs[job.id] = model
            if spec.key is not None:
                self.keys[spec.key] = job.id
            if spec.after:
                after = [ids[p] if type(p) is int else str(p) for p in spec.after]
                model.after = tuple(dict.fromkeys(after))
                blocker = self._blocker(model)
                if blocker is not None:
                    model.error = Text(exact=_parent_failed(blocker))
                    model.cancelled_by = blocker.id
                    self._finish(model, _CANCELLED, now)
                elif self._unmet(model):
                    model.state = _W
            found.extend(model.problems(job))
        return found

    # ---------------------------------------------------------------- claim

    def claimable(self, limit: int) -> list[str]:
        """The ids a claim of ``limit`` must return, in order: priority, then ``run_at``, then enqueue order."""
        ready = [job for job in self.jobs.values() if job.state is _R]
        ready.sort(key=lambda job: (-job.priority, job.run_at, job.seq))
        return [job.id for job in ready[: max(limit, 0)]]

    def claim(self, node: str, claimed: Sequence[Job], limit: int) -> list[str]:
        """Apply a claim that answered ``claimed``; returns what differs."""
        expected = self.claimable(limit)
        if [job.id for job in claimed] != expected:
            return [f"claim of {limit} answered {[job.id for job in claimed]}, expected {expected}"]
        found: list[str] = []
        for job in claimed:
            model = self.jobs[job.id]
            if not job.epoch > model.epoch:
                found.append(f"job {job.id} was claimed under epoch {job.epoch}, not above {model.epoch}")
            model.state, model.epoch, model.epoch_may_grow, model.node = _RUN, job.epoch, False, node
            found.extend(model.problems(job))
        return found

    def holds(self, job_id: str, epoch: int) -> bool:
        """Whether ``epoch`` still holds the running job ``job_id`` (what ``extend`` answers)."""
        job = self.jobs.get(job_id)
        return job is not None and job.state is _RUN and job.epoch == epoch

    # ------------------------------------------------------------- complete

    def complete(self, outcome: Outcome, now: float, *, storable: bool = True) -> JobState | None:
        """Apply one outcome; the state it leaves its job in, or ``None`` when its epoch is stale.

        ``storable``: whether a :class:`Succeeded` outcome's result is one a store can hold.
        """
        if not self.holds(outcome.job_id, outcome.epoch):
            return None
        job = self.jobs[outcome.job_id]
        job.node = None
        if isinstance(outcome, Succeeded):
            if not storable:
                self._fail(job, Text(part="InvalidJob"), None, None, now)
            else:
                job.attempts += 1
                job.result = outcome.result
                job.error = None
                self._finish(job, JobState.SUCCEEDED, now)
        elif isinstance(outcome, Failed):
            self._fail(job, Text(exact=outcome.error), outcome.traceback, outcome.retry_in, now)
        elif isinstance(outcome, Released):
            job.state = _R
        elif isinstance(outcome, Snoozed):
            if job.snoozes >= MAX_SNOOZES:
                self._fail(job, Text(part="snooze"), None, None, now)
            else:
                job.snoozes += 1
                self._wait(job, now + max(outcome.delay, 0.0), now)
        else:  # pragma: no cover
            raise TypeError(f"not an outcome: {outcome!r}")
        return job.state

    def _fail(self, job: ModelJob, error: Text, traceback: str | None, retry_in: float | None, now: float) -> None:
        job.attempts += 1
        job.error = error
        job.errors.append(ModelAttempt(job.attempts, error, traceback, now))
        del job.errors[:-MAX_ERRORS_KEPT]
        if retry_in is None or job.attempts >= job.max_attempts:
            self._finish(job, JobState.DEAD, now)
        else:
            self._wait(job, now + max(retry_in, 0.0), now)

    def _wait(self, job: ModelJob, run_at: float, now: float) -> None:
        job.run_at = run_at
        job.state = _S if run_at > now else _R

    def _finish(self, job: ModelJob, state: JobState, now: float) -> None:
        was_parent = job.id
        job.state = state
        job.finished_at = now
        job.node = None
        self.retained.append(job.id)
        while len(self.retained) > self.max_retained and not self.bound_at_evict:
            self._drop(self.retained[0])
        # Flows: its waiting children (the machine adds flows only with a bound no cascade reaches,
        # so the order a store finishes a cascade's jobs in does not matter here).
        if state is JobState.SUCCEEDED:
            for child in self._children(was_parent):
                if child.state is _W and not self._unmet(child):
                    child.state = _S if child.run_at > now else _R
            return
        # A death or cancel: breadth first, each job named after the nearest parent that ended.
        level = [job]
        while level:
            below = []
            for ended in level:
                for child in self._children(ended.id):
                    if child.state is not _W:
                        continue
                    child.error = Text(exact=_parent_failed(ended))
                    child.cancelled_by = ended.id
                    child.state, child.finished_at, child.node = _CANCELLED, now, None
                    self.retained.append(child.id)
                    below.append(child)
            level = below

    def _drop(self, job_id: str) -> None:
        job = self.jobs.pop(job_id)
        self.retained.remove(job_id)
        if job.key is not None and self.keys.get(job.key) == job_id:
            del self.keys[job.key]
        self.dropped.add(job_id)

    # --------------------------------------------------------------- others

    def cancel(self, job_id: str, now: float) -> tuple[bool, int | None]:
        """Apply ``cancel``: whether it changed the job, and the epoch of the attempt it stopped.

        Raises ``KeyError`` for a job the store does not hold.
        """
        job = self.jobs[job_id]
        if job.state.terminal:
            return False, None
        running = job.epoch if job.state is _RUN else None
        self._finish(job, JobState.CANCELLED, now)
        return True, running

    def retry(self, job_id: str, now: float) -> str | None:
        """Apply ``retry``; ``None`` when it did, else the ``field`` of the ``InvalidJob`` it must
        raise, changing nothing: ``"state"`` unless the job is dead or cancelled, ``"after"`` while a
        parent is.

        Raises ``KeyError`` for a job the store does not hold.
        """
        job = self.jobs[job_id]
        if job.state not in (_DEAD, _CANCELLED):
            return "state"
        if self._blocker(job) is not None:
            return "after"
        self.retained.remove(job_id)
        job.state, job.attempts, job.snoozes = (_W if self._unmet(job) else _R), 0, 0
        job.finished_at, job.result, job.run_at = None, None, now
        job.epoch_may_grow = True
        job.cancelled_by = None
        self._revive(job)
        return None

    def _revive(self, parent: ModelJob) -> None:
        """The jobs cancelled because ``parent`` ended wait again (it was retried), and theirs."""
        for child in self._children(parent.id):
            if child.state is not _CANCELLED or child.cancelled_by != parent.id:
                continue
            other = self._blocker(child)
            if other is not None:
                child.cancelled_by = other.id
                child.error = Text(exact=_parent_failed(other))
                continue
            self.retained.remove(child.id)
            child.state, child.finished_at, child.error, child.cancelled_by = _W, None, None, None
            child.epoch_may_grow = True
            self._revive(child)

    def promote(self, now: float) -> float | None:
        """Apply ``promote``: due scheduled jobs become ready; returns the next ``run_at`` still waiting."""
        waiting = []
        for job in self.jobs.values():
            if job.state is _S:
                if job.run_at <= now:
                    job.state = _R
                else:
                    waiting.append(job.run_at)
        return min(waiting, default=None)

    def evict(self, now: float) -> int:
        """Apply ``evict``: drop terminal jobs past retention (or the bound); returns how many."""
        cutoff = now - self.retention
        evicted = 0
        while self.retained:
            oldest = self.jobs[self.retained[0]]
            assert oldest.finished_at is not None
            if len(self.retained) <= self.max_retained and oldest.finished_at > cutoff:
                break
            self._drop(oldest.id)
            evicted += 1
        return evicted

    def end_session(self, node: str) -> None:
        """A session of ``node`` closed: its running jobs are ready again, uncounted."""
        for job in self.jobs.values():
            if job.state is _RUN and job.node == node:
                job.state, job.node, job.epoch_may_grow = _R, None, True

    def open_session(self, now: float) -> None:
        """A session opened: the retention bounds hold from the start."""
        self.evict(now)

    def waiting(self) -> list[str]:
        """The ids of the waiting jobs."""
        return [job.id for job in self.jobs.values() if job.state is _W]

    def pending(self) -> int:
        """Ready plus scheduled jobs: what ``max_pending`` bounds."""
        return sum(1 for job in self.jobs.values() if job.state in (_R, _S))

    def counts(self) -> dict[str, int]:
        """What ``counts`` must answer."""
        counts = dict.fromkeys(sorted(state.value for state in JobState), 0)
        for job in self.jobs.values():
            counts[job.state.value] += 1
        return counts

    def listed(self, states: Collection[JobState], limit: int) -> list[str]:
        """The ids ``jobs(states, limit=limit)`` must answer: oldest enqueued first."""
        return [job.id for job in self.jobs.values() if job.state in states][:limit]

    def problems(self, snapshots: Sequence[Job], counts: dict[str, int]) -> list[str]:
        """How the store's every job (``snapshots``, oldest first) and ``counts`` differ from the model."""
        found: list[str] = []
        if (ids := [job.id for job in snapshots]) != list(self.jobs):
            found.append(f"the store holds {ids}, expected {list(self.jobs)}")
        else:
            for job in snapshots:
                found.extend(self.jobs[job.id].problems(job))
        if counts != self.counts():
            found.append(f"counts() is {counts}, expected {self.counts()}")
        return found


def _parent_failed(parent: ModelJob) -> str:
    """The error of a job cancelled because ``parent`` ended dead or cancelled (``NewJob.after``)."""
    return f"ParentFailed: parent {parent.id} is {parent.state.value}"
