"""Fault plans: failures, hangs, delays and a simulated crash, decided by a seed.

A :class:`FaultPlan` holds rules. Whether a rule hits an attempt is a pure
function of ``(seed, rule, task, job number, attempt number)``: the job number
is the job's enqueue order in the queue (1, 2, ...), the attempt number is
``job.attempts + 1``. No shared random stream is consumed, so the order in
which trio happens to run tasks cannot change which attempts get faults, and
the same seed replays the same faults.

:class:`FaultSession` is a plan applied to one open queue: it numbers the
queue's jobs, wraps each attempt, and wraps the store's log to count its
records and crash it (:mod:`trioq._testing.crashlog`).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs
import trio

from .._model import Job
from ..stores._base import ClaimRequest, NewJob
from .crashlog import CrashLog, SimulatedCrash

if TYPE_CHECKING:
    from .._registry import Registry, TaskDef
    from .._runtime.executor import Executor

__all__ = ["FaultPlan", "FaultSession", "Injection", "InjectedFailure", "Rule"]

Kind = Literal["fail", "hang", "delay"]
When = Literal["before", "after"]

#: A rule's ``task`` that matches every task.
ANY_TASK = "*"


class InjectedFailure(Exception):
    """The error a ``fail`` fault raises when the plan was given no ``error``."""


@attrs.frozen
class Rule:
    """One fault rule of a plan (see :meth:`FaultPlan.fail` and friends)."""

    number: int
    kind: Kind
    task: str
    times: int | None = None
    prob: float | None = None
    when: When = "before"
    seconds: float = 0.0
    error: Exception | type[Exception] | str | None = None

    def describe(self) -> str:
        """The rule in one line, as the plan's repr shows it: ``fail('task', when='before', times=2)``."""
        limits = []
        if self.times is not None:
            limits.append(f"times={self.times}")
        if self.prob is not None:
            limits.append(f"prob={self.prob:g}")
        if self.kind == "delay":
            head = f"delay({self.task!r}, {self.seconds:g}"
        else:
            head = f"{self.kind}({self.task!r}, when={self.when!r}"
        return head + "".join(f", {limit}" for limit in limits) + ")"


@attrs.frozen
class Injection:
    """One fault the plan injected: what, into which task, job and attempt.

    ``job`` is the job's enqueue order in its queue (1-based), the same on
    every replay; ``job_id`` is its id (which differs between runs).
    ``record`` is the log record after which a crash struck.
    """

    kind: Literal["fail", "hang", "delay", "crash"]
    task: str | None = None
    job: int | None = None
    attempt: int | None = None
    when: When | None = None
    job_id: str | None = None
    seconds: float | None = None
    error: str | None = None
    record: int | None = None

    def __str__(self) -> str:
        if self.kind == "crash":
            return f"crash after log record {self.record}"
        where = f"task {self.task!r}, job {self.job}, attempt {self.attempt}"
        if self.kind == "delay":
            return f"delay {self.seconds:g}s before the handler: {where}"
        what = f"{self.kind} {self.when} the handler: {where}"
        return f"{what} ({self.error})" if self.error else what


def _draw(seed: int, rule: Rule, task: str, job: int, attempt: int) -> float:
    """A uniform number in [0, 1) fixed by its arguments alone."""
    key = f"{seed}\x1f{rule.number}\x1f{rule.kind}\x1f{task}\x1f{job}\x1f{attempt}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _times(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"times must be an int >= 1 or None, got {value!r}")
    return value


def _prob(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"prob must be a number from 0 to 1 or None, got {value!r}")
    return float(value)


def _when(value: str) -> When:
    if value == "before":
        return "before"
    if value == "after":
        return "after"
    raise ValueError(f'when must be "before" or "after", got {value!r}')


def _task(value: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f'task must be a task name (or "*" for every task), got {value!r}')
    return value


class FaultPlan:
    """Which attempts fail, hang or are delayed, and when the queue crashes.

    Apply it with ``trioq.open_queue(..., faults=plan)`` (the ``pytest_trioq``
    fixtures do this for you). Rules may be added before the queue opens or
    while it runs; each is consulted at the start of every attempt.

    ``times=N`` limits a rule to the first ``N`` attempts of each job of the
    task; ``prob=p`` lets each attempt hit with probability ``p``; with both,
    each of the first ``N`` attempts hits with probability ``p``; with neither,
    every attempt hits. ``task="*"`` matches every task. When several rules hit
    one attempt, every delay applies first, then the first ``fail`` or
    ``hang`` in the order the rules were added.

    ``injected`` lists every fault applied so far, in the order they struck;
    :meth:`clear` removes the rules but keeps that record.
    """

    def __init__(self, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        #: The seed every decision is derived from.
        self.seed = seed
        #: Every fault applied so far, in the order they struck.
        self.injected: list[Injection] = []
        #: Log records written by the last queue this plan was applied to (once it closed).
        self.records: int | None = None
        self._rules: list[Rule] = []
        self._crash_after: int | None = None
        self._sessions: list[FaultSession] = []

    # --------------------------------------------------------------- rules

    def fail(
        self,
        task: str,
        *,
        times: int | None = None,
        prob: float | None = None,
        error: Exception | type[Exception] | str | None = None,
        when: When = "before",
    ) -> FaultPlan:
        """Make attempts of ``task`` fail.

        ``when="before"`` raises instead of running the handler;
        ``when="after"`` runs the handler, then fails the attempt as if the
        worker died before recording the success (the job runs again: the case
        that tests a handler's idempotency). ``error`` is an exception instance
        or class, or a message; by default an :class:`InjectedFailure`.
        Returns the plan, so calls chain.
        """
        if isinstance(error, type) and issubclass(error, Exception):
            try:
                error("probe")
            except Exception as exc:
                raise ValueError(
                    f"error={error.__name__} cannot be built from a message ({exc}); pass an instance instead"
                ) from None
        elif error is not None and not isinstance(error, str | Exception):
            raise ValueError(f"error must be an Exception instance or subclass, or a message, got {error!r}")
        return self._add(Rule(0, "fail", _task(task), _times(times), _prob(prob), _when(when), error=error))

    def hang(
        self, task: str, *, times: int | None = None, prob: float | None = None, when: When = "before"
    ) -> FaultPlan:
        """Make attempts of ``task`` hang: no more heartbeats, never returning.

        The attempt's deadline (``timeout``/``heartbeat_timeout``) must end it,
        so a task with neither (its own or the queue's) is refused with a
        ``ValueError`` when the plan meets the queue: it would hang the test.
        ``when="after"`` hangs after the handler returned, before its success
        is recorded.
        """
        return self._add(Rule(0, "hang", _task(task), _times(times), _prob(prob), _when(when)))

    def delay(self, task: str, seconds: float, *, times: int | None = None, prob: float | None = None) -> FaultPlan:
        """Sleep ``seconds`` before the handler runs (a slow dependency).

        The sleep counts against the attempt's timeout, and sends no heartbeat.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 <= seconds < math.inf:
            raise ValueError(f"seconds must be a finite number >= 0, got {seconds!r}")
        return self._add(Rule(0, "delay", _task(task), _times(times), _prob(prob), seconds=float(seconds)))

    def crash(self, *, after_records: int) -> FaultPlan:
        """Kill the queue like ``kill -9`` right after its ``after_records``-th log record.

        Needs a store with a log (:class:`~trioq.WALStore`). Records are counted
        from the queue's open. The record that triggers the crash, and any
        record not yet committed, never reaches the disk; neither does any byte
        the log had not synced (so with ``fsync="never"`` a crash may lose all
        this queue wrote). :class:`~trioq.testing.SimulatedCrash` then comes out
        of ``open_queue``. A crash strikes once: reopening the store with the
        same plan recovers and runs on.
        """
        if isinstance(after_records, bool) or not isinstance(after_records, int) or after_records < 1:
            raise ValueError(f"after_records must be an int >= 1, got {after_records!r}")
        for session in self._sessions:
            session.check_crash()  # all or none: refuse before arming any
        for session in self._sessions:
            session.arm_crash(after_records)
        self._crash_after = after_records
        return self

    def clear(self) -> None:
        """Remove every rule and the crash; :attr:`injected` is kept."""
        self._rules.clear()
        self._crash_after = None
        for session in self._sessions:
            session.arm_crash(None)

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The plan's rules, in the order they were added (numbered from 1): every delay that matches an
        attempt applies, and of the failures and hangs that match, the first added."""
        return tuple(self._rules)

    @property
    def crash_after(self) -> int | None:
        """The armed crash point, or ``None`` (also once the crash struck)."""
        return self._crash_after

    def decide(self, task: str, job: int, attempt: int) -> list[Rule]:
        """The rules that hit attempt ``attempt`` of the ``job``-th job, a ``task`` job.

        A pure function of the seed, the rules and the arguments.
        """
        hits = []
        for rule in self._rules:
            if rule.task != ANY_TASK and rule.task != task:
                continue
            if rule.times is not None and attempt > rule.times:
                continue
            if rule.prob is not None and _draw(self.seed, rule, task, job, attempt) >= rule.prob:
                continue
            hits.append(rule)
        return hits

    def __repr__(self) -> str:
        parts = [rule.describe() for rule in self._rules]
        if self._crash_after is not None:
            parts.append(f"crash(after_records={self._crash_after})")
        return f"<FaultPlan seed={self.seed} [{', '.join(parts)}]>"

    def _add(self, rule: Rule) -> FaultPlan:
        rule = attrs.evolve(rule, number=len(self._rules) + 1)
        for session in self._sessions:
            session.check(rule)  # a refused rule takes no number: later draws stay as they were
        self._rules.append(rule)
        return self


def check_hang_allowed(tasks: Iterable[TaskDef], heartbeat_timeout: float | None) -> None:
    """Refuse a hang into a task that no deadline would ever stop."""
    for task in tasks:
        if task.timeout is None and task.heartbeat_timeout_in(heartbeat_timeout) is None:  # as Attempt decides
            raise ValueError(
                f"cannot inject a hang into task {task.name!r}: it has no timeout and no heartbeat_timeout "
                "(its own or the queue's), so nothing would stop the hung attempt and the test would hang; "
                f"give the task timeout= or heartbeat_timeout=, or open the queue with heartbeat_timeout="
            )


class FaultSession:
    """A plan applied to one open queue (made by ``open_queue``; not public).

    While the plan is applied, the session stands in for three methods, as
    instance attributes (:class:`_Wrapped`; :meth:`close` puts them back): the
    store's ``add`` (to number jobs in enqueue order) and ``claim`` (to number
    each job at its claim), and each executor's ``invoke`` (the one call of a
    handler: failures, hangs and delays strike there). Production code has no
    branch for a plan. On a store with a log (one with a ``_open_log`` method: ``WALStore``),
    the session stands in for that method on the store instance until
    :meth:`close`: the writer each store session opens comes wrapped in a
    :class:`~trioq._testing.crashlog.CrashLog`, which counts the queue's
    records and strikes the armed crash. It is in place before the store's
    session opens, so a crash can strike while it opens. The log calls
    ``callback(exc, record)`` the moment it dies, and this session then calls
    ``on_crash(exc)`` (the queue's own stop).
    """

    def __init__(
        self,
        plan: FaultPlan,
        *,
        registry: Registry,
        heartbeat_timeout: float | None,
        store: Any,
        executors: Sequence[Executor] = (),
        on_crash: Callable[[SimulatedCrash], None],
    ) -> None:
        self.plan = plan
        self._registry = registry
        self._heartbeat_timeout = heartbeat_timeout
        self._store = store
        self._on_crash = on_crash
        self._numbers: dict[str, int] = {}
        self._inflight: set[trio.Event] = set()
        #: Set by ``open_queue`` once the store's session is open (its lock held).
        self.opened = False
        self._crash_at: int | None = None
        self._log: CrashLog | None = None
        #: The store's own way to open its writer, while ours stands in for it.
        self._open_real_log: Callable[..., Any] | None = getattr(store, "_open_log", None)
        for rule in plan.rules:
            self.check(rule)
        if plan.crash_after is not None:
            self.arm_crash(plan.crash_after)
        # Only once nothing can refuse the plan: close() undoes these.
        self._real_add = store.add
        self._real_claim = store.claim
        self._wrapped: list[_Wrapped] = [
            _Wrapped.install(store, "add", self._add),
            _Wrapped.install(store, "claim", self._claim),
        ]
        for executor in executors:  # none: numbering only (no attempts to strike)
            self._wrapped.append(_Wrapped.install(executor, "invoke", self._invoker(executor.invoke)))
        if self._open_real_log is not None:
            self._wrapped.append(_Wrapped.install(store, "_open_log", self._open_log))
        plan._sessions.append(self)

    def check(self, rule: Rule) -> None:
        """Refuse a rule this queue cannot honour (unknown task, unstoppable hang)."""
        if rule.task == ANY_TASK:
            tasks = [self._registry[name] for name in self._registry]
        else:
            tasks = [self._registry[rule.task]]  # UnknownTask names the known ones
        if rule.kind == "hang":
            check_hang_allowed(tasks, self._heartbeat_timeout)

    def check_crash(self) -> None:
        """Refuse a crash this queue's store cannot simulate."""
        if self._open_real_log is None:
            raise ValueError(
                f"FaultPlan.crash() needs a store with a log to recover from (trioq.WALStore); "
                f"{type(self._store).__name__} has none"
            )

    def arm_crash(self, after_records: int | None) -> None:
        """Arm the log to die after ``after_records`` records, counted from the open (``None``: disarm)."""
        if after_records is not None:
            self.check_crash()
        self._crash_at = after_records
        if self._log is not None:
            self._log.crash_at = after_records

    def _open_log(self, *args: Any, **kwargs: Any) -> CrashLog:
        """The store's ``_open_log``, its writer wrapped; the crash armed now is the log's."""
        assert self._open_real_log is not None
        self._log = CrashLog(self._open_real_log(*args, **kwargs), crash_at=self._crash_at, on_crash=self._crashed)
        return self._log

    def _crashed(self, exc: SimulatedCrash, record: int) -> None:
        plan = self.plan
        plan._crash_after = self._crash_at = None
        for session in plan._sessions:
            if session is not self:
                session.arm_crash(None)
        plan.injected.append(Injection("crash", record=record))
        self._on_crash(exc)

    def close(self) -> None:
        """Detach from the plan, the store and the executor (the queue closed); note how many records it wrote."""
        if self in self.plan._sessions:
            self.plan._sessions.remove(self)
        self.arm_crash(None)
        for wrapped in reversed(self._wrapped):
            wrapped.remove()
        self._wrapped.clear()
        if self.opened and self._log is not None:
            self.plan.records = self._log.records

    # ------------------------------------------------------------ wrappers

    async def _add(self, jobs: Sequence[NewJob], *, max_pending: int | None = None) -> list[Job]:
        """The store's ``add``, numbering the jobs it added in enqueue order."""
        added: list[Job] = []
        token = self.enqueue_started()
        try:
            added = await self._real_add(jobs, max_pending=max_pending)
        finally:
            self.enqueue_finished(token, added)
        return added

    async def _claim(self, request: ClaimRequest) -> list[Job]:
        """The store's ``claim``; each job is numbered at its claim, before any deadline runs (the
        number must not depend on waiting for a CPU)."""
        claimed: list[Job] = await self._real_claim(request)
        for job in claimed:
            await self.number(job.id)
        return claimed

    def _invoker(self, real_invoke: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """An executor's call of a handler (``real_invoke``), with the plan's faults."""

        async def invoke(worker: Any, job: Job, task: TaskDef, attempt: Any) -> Any:
            return await self.attempt(job, lambda: real_invoke(worker, job, task, attempt))

        return invoke

    # ---------------------------------------------------------- numbering

    def enqueue_started(self) -> trio.Event:
        """An ``enqueue`` began; pass the token returned to :meth:`enqueue_finished`."""
        token = trio.Event()
        self._inflight.add(token)
        return token

    def enqueue_finished(self, token: trio.Event, jobs: Sequence[Job]) -> None:
        """Number the jobs an ``enqueue`` added (in order; existing keyed jobs keep theirs)."""
        numbers = self._numbers
        for job in jobs:
            if job.id not in numbers:
                numbers[job.id] = len(numbers) + 1
        self._inflight.discard(token)
        token.set()

    async def number(self, job_id: str) -> int:
        """The job's enqueue order in this queue (1, 2, ...); the worker asks at each claim.

        A worker can claim a job before the ``enqueue`` that added it has
        returned (a durable store flushes first): it waits for the enqueues in
        flight at that moment (one of them added the job), never for later
        ones. A job none of them added (recovered from a log, or enqueued by
        another queue on the same store) is numbered at its first claim.
        """
        numbers = self._numbers
        number = numbers.get(job_id)
        if number is not None:
            return number
        for token in list(self._inflight):
            await token.wait()
            if job_id in numbers:
                return numbers[job_id]
        number = numbers[job_id] = len(numbers) + 1
        return number

    # ------------------------------------------------------------ attempts

    async def attempt(self, job: Job, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run one attempt of ``job`` (``call`` runs the handler) with the plan's faults."""
        plan = self.plan
        number = await self.number(job.id)  # numbered at its claim already: no wait
        attempt = job.attempts + 1
        hits = plan.decide(job.task, number, attempt)
        if not hits:
            return await call()
        for rule in hits:
            if rule.kind == "delay":
                self._note(rule, job, number, attempt)
                await trio.sleep(rule.seconds)
        # The first fail or hang added to the plan wins; "before" strikes now.
        fault = next((rule for rule in hits if rule.kind != "delay"), None)
        if fault is not None and fault.when == "before":
            await self._strike(fault, job, number, attempt)
        result = await call()
        if fault is not None:  # an "after" fault: the handler ran, its outcome is lost
            await self._strike(fault, job, number, attempt)
        return result

    async def _strike(self, rule: Rule, job: Job, number: int, attempt: int) -> None:
        """Apply a fail or hang: raises, or sleeps until the attempt's deadline cancels it."""
        if rule.kind == "hang":
            self._note(rule, job, number, attempt)
            await trio.sleep_forever()  # no heartbeat: the attempt's deadline ends it
        else:
            error = self._error(rule)
            self._note(rule, job, number, attempt, error=f"{type(error).__name__}: {error}")
            raise error

    def _error(self, rule: Rule) -> Exception:
        made = rule.error
        if isinstance(made, Exception):
            # A fresh object per attempt, so tracebacks do not pile up; one
            # built with arguments copy cannot replay is raised as given.
            with contextlib.suppress(Exception):
                made = copy.copy(made)
            return made.with_traceback(None)
        if rule.when == "after":
            message = "injected failure after the handler returned: its result was not recorded"
        else:
            message = "injected failure instead of running the handler"
        if isinstance(made, str):
            return InjectedFailure(made)
        if isinstance(made, type) and issubclass(made, Exception):
            return made(message)
        return InjectedFailure(message)

    def _note(self, rule: Rule, job: Job, number: int, attempt: int, *, error: str | None = None) -> None:
        self.plan.injected.append(
            Injection(
                rule.kind,
                task=job.task,
                job=number,
                attempt=attempt,
                when=None if rule.kind == "delay" else rule.when,
                job_id=job.id,
                seconds=rule.seconds if rule.kind == "delay" else None,
                error=error,
            )
        )


class _Wrapped:
    """One method of an object stood in for by a wrapper (an instance attribute), until :meth:`remove`.

    Wrappers nest: a second session on the same store wraps the first's, and
    each removes only its own (the one it shadowed comes back).
    """

    def __init__(self, target: Any, name: str, wrapper: Callable[..., Any], shadowed: Any) -> None:
        self._target, self._name, self._wrapper, self._shadowed = target, name, wrapper, shadowed

    @classmethod
    def install(cls, target: Any, name: str, wrapper: Callable[..., Any]) -> _Wrapped:
        shadowed = vars(target).get(name)
        setattr(target, name, wrapper)
        return cls(target, name, wrapper, shadowed)

    def remove(self) -> None:
        if vars(self._target).get(self._name) == self._wrapper:
            if self._shadowed is None:
                delattr(self._target, self._name)
            else:
                setattr(self._target, self._name, self._shadowed)
