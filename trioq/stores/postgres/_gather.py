"""Adds from concurrent callers, gathered into one statement while the previous one is in flight.

A single-job ``enqueue`` is a round trip and a commit; 32 tasks enqueueing at
once would each wait for their own. The gatherer's task sends whatever
accumulated while its last statement ran as the next one (group commit, as
the WAL's writer does it), and hands each caller its share of the answer.
Each caller's jobs are still all or nothing: a statement inserts all its rows
or none.

A statement out longer than :data:`STALLED` waits on a lock (an idempotency
key another transaction holds, maybe the caller's own ``enqueue_tx`` in a
thread that now enqueues through trio): what accumulated meanwhile goes in a
statement of its own, beside it, at most :data:`MAX_IN_FLIGHT` at once, so
that one key's wait holds up no other add.
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
#: Seconds after which the newest statement in flight counts as stalled (a statement takes a few ms).
STALLED = 0.05
#: At most this many statements in flight at once.
MAX_IN_FLIGHT = 4


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
        self._flights: list[float] = []  # when each statement in flight was sent (trio's clock)
        self._ended = trio.Event()  # set (and replaced) as each statement in flight ends

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
        """Send gathered calls until :meth:`stop` (then every call waiting is sent first), or until cancelled
        (calls taken get their answers: the sends are shielded; calls not taken raise ``RuntimeError``,
        as later calls do)."""
        try:
            async with trio.open_nursery() as sends:
                while self._pending or not self._stopped:
                    if not self._pending:
                        await self._wanted.wait()
                        self._wanted = trio.Event()
                        continue
                    if self._flights:
                        # Gather while a statement is out: until one ends, or the newest has stalled.
                        ended = self._ended
                        with trio.move_on_at(self._flights[-1] + STALLED):
                            await ended.wait()
                        if ended.is_set():
                            continue
                        if len(self._flights) >= MAX_IN_FLIGHT:
                            await ended.wait()
                            continue
                        if not self._pending:  # (their callers were cancelled meanwhile)
                            continue
                    sent = trio.current_time()
                    self._flights.append(sent)
                    sends.start_soon(self._send_some, self._take(), sent)
        finally:
            self._stopped = True
            for call in self._pending:  # not taken: nothing of theirs was sent
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

    def _take(self) -> list[_Call[R, A]]:
        """The calls waiting, oldest first, up to :data:`MAX_ROWS` rows (a call's rows are never split)."""
        batch: list[_Call[R, A]] = []
        size = 0
        while self._pending and (not batch or size + len(self._pending[0].rows) <= MAX_ROWS):
            call = self._pending.pop(0)
            call.taken = True
            batch.append(call)
            size += len(call.rows)
        return batch

    async def _send_some(self, batch: list[_Call[R, A]], sent: float) -> None:
        """Send ``batch`` in one statement and answer each call; ``sent``: its entry in the flights."""
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
        finally:
            self._flights.remove(sent)
            self._ended.set()
            self._ended = trio.Event()
        start = 0
        for call in batch:
            call.answer = answers[start : start + len(call.rows)]
            start += len(call.rows)
            call.done.set()
