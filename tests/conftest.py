"""Shared helpers for trioq's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.lowlevel

pytest_plugins = ["pytester"]


class TaskTracker(trio.abc.Instrument):
    """A trio instrument that knows which tasks spawned since it was added are alive."""

    def __init__(self) -> None:
        self.alive: set[trio.lowlevel.Task] = set()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.alive.add(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.alive.discard(task)


@pytest.fixture
async def task_tracker() -> AsyncIterator[TaskTracker]:
    tracker = TaskTracker()
    trio.lowlevel.add_instrument(tracker)
    try:
        yield tracker
    finally:
        trio.lowlevel.remove_instrument(tracker)
