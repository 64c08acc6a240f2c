"""Fixtures for the Store conformance suite.

Every test in ``tests/stores/`` runs once per store kind in :data:`STORE_KINDS`.
To add a store, add one entry: a factory taking the test's ``tmp_path`` (a
durable store keeps its files there) and, if reopening means something other
than "construct again over the same directory", a ``reopen`` function.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest

import trioq
from trioq.stores import NewJob, Store, StoreConfig

START = 1_700_000_000.0


@attrs.frozen
class StoreKind:
    """How to build one kind of store for a test.

    ``make(path)`` builds a store whose data (if any) lives under ``path``.
    ``reopen(store, path)`` gives a store over the same data as ``store``, for
    a new session once the old one has closed (or to try a concurrent one).
    """

    make: Callable[[Path], Store]
    reopen: Callable[[Store, Path], Store] | None = None


STORE_KINDS: dict[str, StoreKind] = {
    # A MemoryStore keeps its jobs in the object, so reopening is reusing it.
    "memory": StoreKind(make=lambda path: trioq.MemoryStore(), reopen=lambda store, path: store),
    # A WALStore keeps its jobs in its directory: reopening is a new store over
    # the same directory (the default), so every reopen replays the log.
    "wal": StoreKind(make=lambda path: trioq.WALStore(path / "wal", fsync="never")),
    "wal-always": StoreKind(make=lambda path: trioq.WALStore(path / "wal", fsync="always")),
    "wal-interval": StoreKind(make=lambda path: trioq.WALStore(path / "wal", fsync="interval")),
}


class FakeClock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: float = START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@attrs.define
class Signals:
    """What a store told the runtime through ``on_ready`` and ``on_scheduled``."""

    ready: list[int] = attrs.field(factory=list)
    scheduled: list[float] = attrs.field(factory=list)

    def on_ready(self, n: int) -> None:
        self.ready.append(n)

    def on_scheduled(self, run_at: float) -> None:
        self.scheduled.append(run_at)

    def clear(self) -> None:
        self.ready.clear()
        self.scheduled.clear()


@attrs.define
class StoreFactory:
    """Builds stores of one kind, and opens sessions on them with a fake clock."""

    name: str
    kind: StoreKind
    path: Path
    clock: FakeClock = attrs.field(factory=FakeClock)
    signals: Signals = attrs.field(factory=Signals)

    def __call__(self) -> Store:
        return self.kind.make(self.path)

    def reopen(self, store: Store) -> Store:
        if self.kind.reopen is not None:
            return self.kind.reopen(store, self.path)
        return self.kind.make(self.path)

    def config(self, **overrides: Any) -> StoreConfig:
        fields: dict[str, Any] = {
            "clock": self.clock,
            "on_ready": self.signals.on_ready,
            "on_scheduled": self.signals.on_scheduled,
        }
        fields.update(overrides)
        return StoreConfig(**fields)

    @asynccontextmanager
    async def session(self, store: Store, **overrides: Any) -> AsyncIterator[Store]:
        async with store.session(self.config(**overrides)):
            yield store

    def job(
        self,
        task: str = "t",
        payload: dict[str, Any] | None = None,
        *,
        delay: float = 0.0,
        priority: int = 0,
        key: str | None = None,
        max_attempts: int = 3,
    ) -> NewJob:
        """A :class:`NewJob` due ``delay`` seconds from the fake clock's now."""
        return NewJob(
            task=task,
            payload={} if payload is None else payload,
            priority=priority,
            key=key,
            max_attempts=max_attempts,
            run_at=self.clock.now + delay,
        )


@pytest.fixture(params=sorted(STORE_KINDS))
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    return StoreFactory(request.param, STORE_KINDS[request.param], tmp_path)


@pytest.fixture
async def store(store_factory: StoreFactory) -> AsyncIterator[Store]:
    """A fresh store, open in a session with default retention."""
    async with store_factory.session(store_factory()) as opened:
        yield opened
