"""The ready queue: priority lanes, each a FIFO with a small heap for stragglers.

Ready jobs run by priority (larger first), then ``run_at``, then enqueue
order. Most jobs arrive in that order already (enqueued now, in sequence), so
each priority lane keeps them in a deque: O(1) in and out, and no heap walk
across a large backlog, which costs cache misses by the million. A job that
arrives out of order (a delayed job promoted with an earlier ``run_at``, a
retry, a release) goes to the lane's heap; popping takes the smaller head of
the two. Items are ``(run_at, seq, job_id)`` tuples; the caller checks that an
item is still current (lazy deletion) and pops again if not.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque

__all__ = ["ReadyItem", "ReadyQueue"]

ReadyItem = tuple[float, int, str]


class _Lane:
    __slots__ = ("fifo", "late")

    def __init__(self) -> None:
        self.fifo: deque[ReadyItem] = deque()
        self.late: list[ReadyItem] = []


class ReadyQueue:
    """Items ordered by priority (desc), then ``(run_at, seq)`` (asc)."""

    def __init__(self) -> None:
        self._lanes: dict[int, _Lane] = {}
        self._order: list[int] = []  # negated priorities, ascending: best lane first

    def push(self, priority: int, item: ReadyItem) -> None:
        lane = self._lanes.get(priority)
        if lane is None:
            lane = self._lanes[priority] = _Lane()
            bisect.insort(self._order, -priority)
        fifo = lane.fifo
        if not fifo or item >= fifo[-1]:
            fifo.append(item)
        else:
            heapq.heappush(lane.late, item)

    def first(self) -> ReadyItem | None:
        """The best item, without removing it."""
        for negated in self._order:
            lane = self._lanes[-negated]
            fifo, late = lane.fifo, lane.late
            if fifo:
                return late[0] if late and late[0] < fifo[0] else fifo[0]
            if late:
                return late[0]
        return None

    def pop(self) -> ReadyItem | None:
        """Remove and return the best item (``None`` when empty)."""
        while self._order:
            negated = self._order[0]
            lane = self._lanes[-negated]
            fifo, late = lane.fifo, lane.late
            if fifo:
                if late and late[0] < fifo[0]:
                    return heapq.heappop(late)
                return fifo.popleft()
            if late:
                return heapq.heappop(late)
            del self._lanes[-negated]  # drop the empty lane
            del self._order[0]
        return None
