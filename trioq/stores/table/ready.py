"""The ready queue: priority lanes, each a FIFO with a small heap for stragglers.

Ready jobs run by priority (larger first), then ``run_at``, then enqueue
order. Most jobs arrive in that order already (enqueued now, in sequence), so
each priority lane keeps them in a FIFO: O(1) in and out, and no heap walk
across a large backlog, which costs cache misses by the million. A job that
arrives out of order (a delayed job promoted with an earlier ``run_at``, a
retry, a release) goes to the lane's heap; popping takes the smaller head of
the two. Items are ``(run_at, seq, job, token)`` tuples (``seq`` is unique, so
nothing after it is ever compared); the caller checks that an item is still
current (lazy deletion) and pops again if not.

The FIFO stores its items in chunks: full chunks are tuples, which CPython's
cyclic GC stops tracking once their items are untracked (tuples of a float,
ints and a table entry are: entries are invisible to the GC). A collection of the oldest generation then
visits one chunk per :data:`CHUNK` waiting jobs instead of every job: with a
plain deque of a million items each such collection took ~17 ms, and there
are dozens of them while a million jobs are enqueued.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

__all__ = ["CHUNK", "Fifo", "ReadyItem", "ReadyQueue"]

T = TypeVar("T")
ReadyItem = tuple[float, int, Any, int]

#: Items per FIFO chunk.
CHUNK = 1024


class Fifo(Generic[T]):
    """A first-in first-out queue kept in chunks: ``head[pos:]``, each of ``full``, then ``tail``.

    Full chunks are tuples (see the module docstring: the GC visits a chunk,
    not its items). ``head`` and ``pos`` are read directly by hot loops.
    """

    __slots__ = ("chunk", "full", "head", "pos", "tail")

    def __init__(self, chunk: int = CHUNK) -> None:
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk!r}")
        self.chunk = chunk
        self.head: tuple[T, ...] = ()
        self.pos = 0
        self.full: deque[tuple[T, ...]] = deque()
        self.tail: list[T] = []

    def __bool__(self) -> bool:
        return self.pos < len(self.head) or bool(self.full) or bool(self.tail)

    def __len__(self) -> int:
        """The number of items (O(chunks): for bookkeeping, not hot paths)."""
        return len(self.head) - self.pos + sum(len(chunk) for chunk in self.full) + len(self.tail)

    def __iter__(self) -> Iterator[T]:
        """The items, first to last (the queue must not change meanwhile)."""
        yield from self.head[self.pos :]
        for chunk in self.full:
            yield from chunk
        yield from self.tail

    def append(self, item: T) -> None:
        tail = self.tail
        tail.append(item)
        if len(tail) >= self.chunk:
            self.full.append(tuple(tail))
            tail.clear()

    def last(self) -> T | None:
        """The last item, or ``None`` when empty."""
        if self.tail:
            return self.tail[-1]
        if self.full:
            return self.full[-1][-1]
        if self.pos < len(self.head):
            return self.head[-1]
        return None

    def first(self) -> T | None:
        """The first item (``None`` when empty), moving to the next chunk when the head is used up."""
        if self.pos < len(self.head):
            return self.head[self.pos]
        if self.full:
            self.head = self.full.popleft()
        elif self.tail:
            self.head = tuple(self.tail)
            self.tail.clear()
        else:
            self.head = ()
            self.pos = 0
            return None
        self.pos = 0
        return self.head[0]

    def popleft(self) -> T | None:
        """Remove and return the first item (``None`` when empty)."""
        item = self.first()
        if item is not None:
            self.pos += 1
        return item


class _Lane:
    """One priority's items: in order in ``fifo``, out of order in the ``late`` heap."""

    __slots__ = ("fifo", "late")

    def __init__(self, chunk: int) -> None:
        self.fifo: Fifo[ReadyItem] = Fifo(chunk)
        self.late: list[ReadyItem] = []

    def append(self, item: ReadyItem) -> None:
        """Add ``item`` to the FIFO, or to the heap if it sorts before the FIFO's last item."""
        last = self.fifo.last()
        if last is not None and item < last:
            heapq.heappush(self.late, item)
        else:
            self.fifo.append(item)


class ReadyQueue:
    """Items ordered by priority (desc), then ``(run_at, seq)`` (asc)."""

    def __init__(self, chunk: int = CHUNK) -> None:
        self._chunk = chunk  # checked by each lane's Fifo
        self._lanes: dict[int, _Lane] = {}
        self._order: list[int] = []  # negated priorities, ascending: best lane first
        #: Items held, stale ones included (the table compacts on this).
        self.size = 0

    def __iter__(self) -> Iterator[ReadyItem]:
        """Every item held, in no particular order (the queue must not change meanwhile)."""
        for lane in self._lanes.values():
            yield from lane.fifo
            yield from lane.late

    def push(self, priority: int, item: ReadyItem) -> None:
        self.size += 1
        lane = self._lanes.get(priority)
        if lane is None:
            lane = self._lanes[priority] = _Lane(self._chunk)
            bisect.insort(self._order, -priority)
        lane.append(item)

    def first(self) -> ReadyItem | None:
        """The best item, without removing it."""
        for negated in self._order:
            lane = self._lanes[-negated]
            head = lane.fifo.first()
            late = lane.late
            if head is not None:
                return late[0] if late and late[0] < head else head
            if late:
                return late[0]
        return None

    def pop(self) -> ReadyItem | None:
        """Remove and return the best item (``None`` when empty)."""
        while self._order:
            negated = self._order[0]
            lane = self._lanes[-negated]
            late = lane.late
            fifo = lane.fifo
            pos = fifo.pos
            head: ReadyItem | None
            if pos < len(fifo.head):
                head = fifo.head[pos]
            else:
                head = fifo.first()
                pos = 0
            if head is not None:
                self.size -= 1
                if late and late[0] < head:
                    return heapq.heappop(late)
                fifo.pos = pos + 1
                return head
            if late:
                self.size -= 1
                return heapq.heappop(late)
            del self._lanes[-negated]  # drop the empty lane
            del self._order[0]
        return None
