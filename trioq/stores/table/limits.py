"""The job table's limit keys: slots held by running attempts, rate tokens, and the jobs passed over.

A job is claimed only if every limit key it holds has a free slot (fewer than
``max`` running attempts hold the key) and a token (the key's GCRA admits a
start now: :meth:`~trioq._model.Limit.admit`). A ready job that fails either
check is *passed over*, not waited for: it leaves the ready queue and is
parked, and the claim takes the next job. A job parked for a key's ``max``
waits in that key's FIFO until an attempt holding the key ends; one parked
for a rate waits in a heap until its token is due. Either way it stays
``ready`` (counts, snapshots) and its table slot is unchanged, so a cancel or
a retry meanwhile makes the parked item stale, as with the ready queue's
items (lazy deletion).

Nothing here is a counter a crash can leave behind: the slots are counted
from the running attempts the table itself moves (a recovered log releases
its running jobs, and their slots with them), and the rate's state is set
only by claims, which a log records with their time.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..._model import JobState, Limit
from .._base import no_limits

if TYPE_CHECKING:
    from .jobs import Entry

__all__ = ["LimitState"]


class LimitState:
    """The limit keys' state for one table (see the module docstring)."""

    def __init__(self) -> None:
        #: The limit each key has (the store sets it from ``StoreConfig.limits``).
        self.limit_of: Callable[[str], Limit | None] = no_limits
        self.holders: dict[str, int] = {}  # key -> running attempts holding it
        self.tat: dict[str, float] = {}  # key -> its GCRA's theoretical arrival time
        self._blocked: dict[str, deque[tuple[Entry, int]]] = {}  # key -> jobs parked for its max, FIFO
        self._throttled: list[tuple[float, int, Entry, int]] = []  # (due, seq, entry, slot): parked for a rate
        #: Whether a job holding a key was ever added: claims then need the real time.
        self.used = False

    def clear(self) -> None:
        self.holders.clear()
        self.tat.clear()
        self._blocked.clear()
        self._throttled.clear()
        self.used = False

    def admit(self, entry: Entry, now: float) -> float | None:
        """Whether ``entry`` may start at ``now``: ``None`` if so; else it is parked, and the answer is
        when it is due again (``math.inf``: once a slot frees; a time: when its token is due)."""
        limit_of, holders = self.limit_of, self.holders
        for key in entry.limits:
            limit = limit_of(key)
            if limit is not None and limit.max is not None and holders.get(key, 0) >= limit.max:
                self._blocked.setdefault(key, deque()).append((entry, entry.slot))
                return math.inf
        due = -math.inf
        for key in entry.limits:
            limit = limit_of(key)
            if limit is not None and limit.rate is not None:
                tat = self.tat.get(key, -math.inf)
                if limit.admit(tat, now) is None:
                    due = max(due, limit.due(tat, now))
        if due == -math.inf:
            return None
        heapq.heappush(self._throttled, (due, entry.seq, entry, entry.slot))
        return due

    def hold(self, entry: Entry, now: float | None) -> None:
        """``entry``'s attempt starts at ``now``: take a slot of each key, and a token of each rate
        (``now=None``: a replayed claim of a log that recorded no time; its tokens are not taken)."""
        limit_of, holders, tats = self.limit_of, self.holders, self.tat
        for key in entry.limits:
            holders[key] = holders.get(key, 0) + 1
            if now is None:
                continue
            limit = limit_of(key)
            if limit is not None and limit.rate is not None:
                tat = limit.admit(tats.get(key, -math.inf), now)
                # Admitted by admit() just now, or a replayed claim: take the token even if late.
                tats[key] = tat if tat is not None else max(tats.get(key, now), now) + limit.interval

    def unhold(self, entry: Entry) -> list[Entry]:
        """``entry``'s attempt ended: give its slots back; the parked jobs a freed slot lets go, oldest
        first (at most as many as slots freed; still current, for the table to put back)."""
        freed: list[Entry] = []
        holders = self.holders
        for key in entry.limits:
            left = holders.get(key, 0) - 1
            if left > 0:
                holders[key] = left
            else:
                holders.pop(key, None)
            parked = self._blocked.get(key)
            if not parked:
                continue
            limit = self.limit_of(key)
            room = 1 if limit is None or limit.max is None else limit.max - max(left, 0)
            while room > 0 and parked:
                waiting, slot = parked.popleft()
                if waiting.slot == slot and waiting.state is JobState.READY:
                    freed.append(waiting)
                    room -= 1
            if not parked:
                del self._blocked[key]
        return freed

    def due(self, now: float) -> list[Entry]:
        """The rate-parked jobs whose token is due at ``now`` (still current), taken off the heap."""
        heap = self._throttled
        out: list[Entry] = []
        while heap and heap[0][0] <= now:
            _, _, entry, slot = heapq.heappop(heap)
            if entry.slot == slot and entry.state is JobState.READY:
                out.append(entry)
        return out

    def next_due(self) -> float | None:
        """When the first rate-parked job is due (``None``: none is parked)."""
        heap = self._throttled
        while heap:
            _, _, entry, slot = heap[0]
            if entry.slot == slot and entry.state is JobState.READY:
                return heap[0][0]
            heapq.heappop(heap)
        return None

    def parked(self) -> dict[str, int]:
        """How many jobs are parked per key for its ``max`` (stale ones included: a figure for stats)."""
        return {key: len(waiting) for key, waiting in self._blocked.items()}
