"""What the conformance cases drive a store with: its kind, a fake wall clock, recorded hints."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs

from ..._model import Job, JobState, Limit
from .._base import ClaimRequest, NewJob, Outcome, Store, StoreConfig, no_limits

__all__ = ["ALL_STATES", "NODE", "START", "FakeClock", "Harness", "Hints", "StoreKind", "claim_one", "complete_one"]

#: The fake clock's start: wall-clock seconds in November 2023.
START = 1_700_000_000.0
#: The node of a case's session and of its claims (the model-based run adds a second one).
NODE = "node-a"

#: Every state's string value: the keys :meth:`Store.counts` answers with.
ALL_STATES = frozenset(state.value for state in JobState)


@attrs.frozen
class StoreKind:
    """How the conformance suite builds one kind of store, and what that kind promises.

    ``make(path)`` builds a store whose data (if any) lives under ``path``, a
    fresh directory for each case (and for each example of the model-based
    run). ``reopen(store, path)`` gives a store over the same data as
    ``store``, for a new session once the old one has closed, or to try a
    second one alongside it; by default it calls ``make(path)`` again (right
    for a store that keeps its data in ``path``; a store that keeps its jobs
    in the object, like :class:`~trioq.MemoryStore`, returns ``store``).

    ``checkpoint(store)``: compact the store's durable form now (the WAL's
    checkpoint), for the cases that check what survives one; ``None`` for a
    store that has no such step.

    ``concurrent_sessions``: the store serves several sessions (nodes) over
    the same data at once, as a shared database does. Then the cases about
    nodes and leases run, the model-based run uses two nodes, and the case
    that a second session is refused is skipped. ``False`` (the embedded
    stores): a second session must be refused with a clear error.

    ``inline_hints``: the store calls ``StoreConfig``'s hints inside the call
    that caused them, exactly once each (an in-process store). A store whose
    hints come from elsewhere (late, or lost) sets it ``False``: the cases
    then check the hints' effect no further than the protocol promises.

    ``nodes``: how many nodes (sessions over the same data, 2 or 3) the
    model-based run drives, for a kind with ``concurrent_sessions``.

    ``bound_at_evict``: the store applies ``max_retained`` when :meth:`evict`
    runs (a shared store's leader, in batches), not inside the transition
    that finishes a job; the cases then check the bound after ``evict``.

    ``model_examples``: how many examples the model-based run takes on this
    kind (``None``: the case class's ``model_examples``); a kind whose every
    call is a round trip to a server may take fewer, to keep a suite's time.
    """

    make: Callable[[Path], Store]
    reopen: Callable[[Store, Path], Store] | None = None
    checkpoint: Callable[[Store], Awaitable[None]] | None = None
    concurrent_sessions: bool = False
    inline_hints: bool = True
    nodes: int = attrs.field(default=2, validator=attrs.validators.in_((2, 3)))
    bound_at_evict: bool = False
    model_examples: int | None = None


class FakeClock:
    """A wall clock the test moves by hand: the ``StoreConfig.clock`` of every session."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` ahead; returns the new time."""
        self.now += seconds
        return self.now


@attrs.define
class Hints:
    """Every hint a store gave through ``StoreConfig``, in order."""

    ready: list[int] = attrs.field(factory=list)
    scheduled: list[float] = attrs.field(factory=list)
    cancelled: list[tuple[str, int]] = attrs.field(factory=list)
    finished: list[Job] = attrs.field(factory=list)

    def on_ready(self, n: int) -> None:
        self.ready.append(n)

    def on_scheduled(self, run_at: float) -> None:
        self.scheduled.append(run_at)

    def on_cancel(self, job_id: str, epoch: int) -> None:
        self.cancelled.append((job_id, epoch))

    def on_finished(self, job: Job) -> None:
        self.finished.append(job)

    def clear(self) -> None:
        """Forget the hints so far."""
        self.ready.clear()
        self.scheduled.clear()
        self.cancelled.clear()
        self.finished.clear()


@attrs.define
class Harness:
    """Builds stores of one kind under ``path`` and opens sessions on them, on one fake clock.

    Every session's ``StoreConfig`` records its hints in :attr:`hints` and
    names :attr:`node` (unless a case overrides either).
    """

    kind: StoreKind
    path: Path
    clock: FakeClock = attrs.field(factory=FakeClock)
    hints: Hints = attrs.field(factory=Hints)
    node: str = NODE
    #: The limits every session's ``StoreConfig.limits`` resolves keys with (declare with :meth:`limit`).
    limits: dict[str, Limit] = attrs.field(factory=dict)

    def limit(self, key: str, **bounds: Any) -> Limit:
        """Declare a limit on ``key`` for the sessions this harness opens from now on (an exact key, or
        a pattern ending in ``*``); ``bounds`` as ``Registry.limit`` takes them. A session opened while
        none is declared gets :func:`~trioq.stores._base.no_limits`, as the runtime hands a store for a
        registry that declares none: the store may then claim without looking at keys, and the cases
        that declare none check that path."""
        self.limits[key] = limit = Limit(key, **bounds)
        return limit

    def limit_of(self, key: str) -> Limit | None:
        """The limit of a concrete ``key``: its own, else the longest pattern matching it."""
        found = self.limits.get(key)
        if found is not None:
            return found
        patterns = [limit for name, limit in self.limits.items() if name.endswith("*") and key.startswith(name[:-1])]
        return max(patterns, key=lambda limit: len(limit.key), default=None)

    def make(self) -> Store:
        """A new store of this kind over :attr:`path`."""
        return self.kind.make(self.path)

    def reopen(self, store: Store) -> Store:
        """A store over the same data as ``store`` (see :class:`StoreKind`)."""
        if self.kind.reopen is not None:
            return self.kind.reopen(store, self.path)
        return self.kind.make(self.path)

    def config(self, **overrides: Any) -> StoreConfig:
        """A ``StoreConfig`` on the fake clock, recording hints; ``overrides`` replace its fields."""
        fields: dict[str, Any] = {
            "clock": self.clock,
            "node": self.node,
            "on_ready": self.hints.on_ready,
            "on_scheduled": self.hints.on_scheduled,
            "on_cancel": self.hints.on_cancel,
            "on_finished": self.hints.on_finished,
            "limits": self.limit_of if self.limits else no_limits,
        }
        fields.update(overrides)
        return StoreConfig(**fields)

    @asynccontextmanager
    async def session(self, store: Store, **overrides: Any) -> AsyncIterator[Store]:
        """Open ``store`` with :meth:`config` (``overrides`` applied) for the block; yields it."""
        async with store.session(self.config(**overrides)):
            yield store

    async def checkpoint(self, store: Store) -> None:
        """Run the kind's checkpoint on the open ``store`` (nothing for a kind without one)."""
        if self.kind.checkpoint is not None:
            await self.kind.checkpoint(store)

    def hinted(self, *, ready: Sequence[int] | None = None, scheduled: Sequence[float] | None = None) -> bool:
        """Whether the hints so far are exactly ``ready`` and ``scheduled`` (those given).

        Always true for a kind whose hints are not inline: it promises no more.
        """
        if not self.kind.inline_hints:
            return True
        return (ready is None or self.hints.ready == list(ready)) and (
            scheduled is None or self.hints.scheduled == list(scheduled)
        )

    def job(
        self,
        task: str = "t",
        payload: dict[str, Any] | None = None,
        *,
        delay: float = 0.0,
        priority: int = 0,
        key: str | None = None,
        max_attempts: int = 3,
        queue: str = "default",
        tenant: str | None = None,
        deadline: float | None = None,
        limits: Sequence[str] = (),
        after: Sequence[str | int] = (),
    ) -> NewJob:
        """A :class:`NewJob` due ``delay`` seconds from the store's now (the fake clock's), waiting for
        the parents ``after`` (ids, or indexes of earlier jobs of the same ``add``)."""
        return NewJob(
            task=task,
            payload={} if payload is None else payload,
            priority=priority,
            key=key,
            max_attempts=max_attempts,
            delay=float(delay),
            queue=queue,
            tenant=tenant,
            deadline=None if deadline is None else float(deadline),
            limits=tuple(limits),
            after=tuple(after),
        )

    def request(
        self, limit: int = 1, *, lease: float = 30.0, node: str | None = None, queues: Sequence[str] | None = None
    ) -> ClaimRequest:
        """A claim of up to ``limit`` jobs of ``queues`` (``None``: all) for ``node`` (by default :attr:`node`)."""
        names = None if queues is None else tuple(queues)
        return ClaimRequest(self.node if node is None else node, limit, lease, names)


async def claim_one(store: Store, node: str = NODE, *, lease: float = 30.0) -> Job:
    """Claim exactly one job for ``node``: the suite's shorthand where one job must be ready."""
    claimed = await store.claim(ClaimRequest(node, 1, lease))
    assert len(claimed) == 1, f"expected one claimed job, got {claimed!r}"
    return claimed[0]


async def complete_one(store: Store, outcome: Outcome) -> JobState | None:
    """Apply one outcome; the state its job is in now, or ``None`` when refused as stale."""
    states = await store.complete([outcome])
    assert len(states) == 1, f"complete() answered {states!r} for one outcome"
    return states[0]
