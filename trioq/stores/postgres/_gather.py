"""Adds from concurrent callers, gathered into one statement while the previous one is in flight.

A single-job ``enqueue`` is a round trip and a commit; 32 tasks enqueueing at
once would each wait for their own. The gatherer's task sends whatever
accumulated while its last statement ran as the next one (group commit, as
the WAL's writer does it), and hands each caller its share of the answer.
Each caller's jobs are still all or nothing: a statement inserts all its rows
or none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import attrs
import trio

__all__ = ["Gatherer"]

R = TypeVar("R")
A = TypeVar("A")

_STOPPED = "the store is closed (or its adder failed) before this enqueue was sent; nothing was added"
#: At most this many rows go in one statement (the rest wait for the next).
MAX_ROWS = 5000


@attrs.define(eq=False)
class _Call(Generic[R, A]):
    rows: Sequence[R]
    done: trio.Event = attrs.Factory(trio.Event)
    taken: bool = False
    answer: list[A] | None = None
    error: BaseException | None = None


class Gatherer(Generic[R, A]):
    """Send rows with ``send(rows) -> answers`` (one answer per row), gathering concurrent calls.

    :meth:`run` is the task that sends; :meth:`call` waits for it. A caller
    cancelled before its rows are taken adds nothing; once taken, it waits
    for the statement (a store call is not a cancel point once it changed
    something) and the cancel reaches it at its next checkpoint.
    """

    def __init__(self, send: Callable[[list[R]], Awaitable[list[A]]]) -> None:
        self._send = send
        self._pending: list[_Call[R, A]] = []
        self._wanted = trio.Event()
        self._stopped = False
        self._drained = trio.Event()  # set once run() has ended: every call taken has its answer

    async def call(self, rows: Sequence[R]) -> list[A]:
        """``send``'s answers for ``rows``, sent with whatever else is waiting.

        Raises ``RuntimeError`` (nothing added) once :meth:`run` has stopped.
        """
        if self._stopped:
            await trio.lowlevel.checkpoint()
            raise RuntimeError(_STOPPED)
        call: _Call[R, A] = _Call(rows)
        self._pending.append(call)
        self._wanted.set()
        try:
            await call.done.wait()
        except trio.Cancelled:
            if not call.taken:
                self._pending.remove(call)
                raise
            with trio.CancelScope(shield=True):
                await call.done.wait()
        if call.error is not None:
            raise call.error
        assert call.answer is not None
        return call.answer

    async def run(self) -> None:
        """Send gathered calls until :meth:`stop`, or until cancelled while none waits (the sends are
        shielded: calls waiting when the cancel comes are sent first); later calls raise ``RuntimeError``."""
        try:
            while not self._stopped:
                await self._wanted.wait()
                self._wanted = trio.Event()
                while self._pending:
                    await self._send_some()
        finally:
            self._stopped = True
            for call in self._pending:  # only if a send raised: nothing of theirs was sent
                call.error = RuntimeError(_STOPPED)
                call.done.set()
            self._pending = []
            self._drained.set()

    async def stop(self) -> None:
        """Take no more calls (they raise ``RuntimeError``, nothing added), and return once every call
        taken or waiting has its answer: what they changed is in the store from then on."""
        self._stopped = True
        self._wanted.set()
        await self._drained.wait()

    async def _send_some(self) -> None:
        batch: list[_Call[R, A]] = []
        size = 0
        while self._pending and (not batch or size + len(self._pending[0].rows) <= MAX_ROWS):
            call = self._pending.pop(0)
            call.taken = True
            batch.append(call)
            size += len(call.rows)
        rows = [row for call in batch for row in call.rows]
        try:
            with trio.CancelScope(shield=True):  # taken calls get their answer, whatever happens around
                answers = await self._send(rows)
        except BaseException as exc:
            for call in batch:
                call.error = exc
                call.done.set()
            if not isinstance(exc, Exception):
                raise
            return
        start = 0
        for call in batch:
            call.answer = answers[start : start + len(call.rows)]
            start += len(call.rows)
            call.done.set()
