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
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

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
        # key -> jobs let go for a freed slot of it and not yet claimed (each carries the key in its
        # ``waking``): the slot is theirs until they take it or leave, and then the next one's.
        self._pending: dict[str, int] = {}
        #: The paused queues (the table's set): a job of one is not let go for a slot it could not take.
        self.paused: Container[str] = ()
        self._out: list[Entry] = []
        self._next_sweep = -math.inf
        #: Whether a job holding a key was ever added: claims then need the real time.
        self.used = False

    def clear(self) -> None:
        self.holders.clear()
        self.tat.clear()
        self._blocked.clear()
        self._throttled.clear()
        self._pending.clear()
        self._out.clear()
        self.used = False

    def drain(self) -> list[Entry]:
        """The parked jobs let go since the last call (still current), for the table to put back."""
        out, self._out = self._out, []
        return out

    def admit(self, entry: Entry, now: float) -> float | None:
        """Whether ``entry`` may start at ``now``: ``None`` if so; else it is parked, and the answer is
        when it is due again (``math.inf``: once a slot frees; a time: when its token is due)."""
        woken = entry.waking
        if woken is not None:  # let go for a slot: it takes it now, or passes it on below
            self._unpend(entry, woken)
        limit_of, holders = self.limit_of, self.holders
        for key in entry.limits:
            limit = limit_of(key)
            if limit is not None and limit.max is not None and holders.get(key, 0) >= limit.max:
                self._blocked.setdefault(key, deque()).append((entry, entry.slot))
                if woken is not None and woken != key:
                    self._wake(woken)  # the slot it was let go for goes to the next in line
                return math.inf
        due = -math.inf
        for key in entry.limits:
            limit = limit_of(key)
            if limit is not None and limit.rate is not None:
                tat = self.tat.get(key, -math.inf)
                if limit.admit(tat, now) is None:
                    due = max(due, limit.due(tat, now))
        if due == -math.inf:
            if woken is not None:
                self._pending[woken] = self._pending.get(woken, 0) + 1  # still its: hold() takes it
                entry.waking = woken
            return None
        heapq.heappush(self._throttled, (due, entry.seq, entry, entry.slot))
        if woken is not None:
            self._wake(woken)
        return due

    def hold(self, entry: Entry, now: float | None) -> None:
        """``entry``'s attempt starts at ``now``: take a slot of each key, and a token of each rate
        (``now=None``: a replayed claim of a log that recorded no time; its tokens are not taken)."""
        if entry.waking is not None:
            self._unpend(entry, entry.waking)
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

    def unhold(self, entry: Entry) -> None:
        """``entry``'s attempt ended: give its slots back, letting go as many parked jobs as slots came
        free, oldest first (see :meth:`drain`)."""
        holders = self.holders
        for key in entry.limits:
            left = holders.get(key, 0) - 1
            if left > 0:
                holders[key] = left
            else:
                holders.pop(key, None)
            self._wake(key)

    def left(self, entry: Entry) -> None:
        """``entry`` left ``ready`` without being claimed (cancelled, expired): a slot it was let go
        for goes to the next job in line."""
        woken = entry.waking
        if woken is not None:
            self._unpend(entry, woken)
            self._wake(woken)

    def promised(self) -> bool:
        """Whether any job let go for a freed slot has not taken it yet."""
        return bool(self._pending)

    def rewake(self) -> None:
        """A queue was resumed: let go the parked jobs whose keys have room (they may be of it)."""
        for key in list(self._blocked):
            self._wake(key)

    def _unpend(self, entry: Entry, key: str) -> None:
        entry.waking = None
        left = self._pending.get(key, 0) - 1
        if left > 0:
            self._pending[key] = left
        else:
            self._pending.pop(key, None)

    def _wake(self, key: str) -> None:
        """Let go parked jobs of ``key`` while it has room: slots neither held nor promised to a job let
        go earlier. A job of a paused queue stays parked (it could not take the slot)."""
        parked = self._blocked.get(key)
        if not parked:
            return
        limit = self.limit_of(key)
        bound = 1 if limit is None or limit.max is None else limit.max
        room = bound - self.holders.get(key, 0) - self._pending.get(key, 0)
        kept: list[tuple[Entry, int]] = []
        while room > 0 and parked:
            waiting, slot = item = parked.popleft()
            if waiting.slot != slot or waiting.state is not JobState.READY:
                continue  # stale: cancelled, or put back by another way since
            if waiting.queue in self.paused:
                kept.append(item)
                continue
            waiting.waking = key
            self._pending[key] = self._pending.get(key, 0) + 1
            self._out.append(waiting)
            room -= 1
        parked.extendleft(reversed(kept))
        if not parked:
            del self._blocked[key]

    def usage(self) -> dict[str, tuple[int, int, float | None]]:
        """Each key in use: ``(running attempts holding it, current jobs parked for a free slot of it,
        its rate's ``tat`` or None)``; keys with none of the three are left out (for ``stats()``)."""
        usage: dict[str, list[Any]] = {key: [n, 0, None] for key, n in self.holders.items()}
        for key, parked in self._blocked.items():
            current = sum(1 for entry, slot in parked if entry.slot == slot and entry.state is JobState.READY)
            if current:
                usage.setdefault(key, [0, 0, None])[1] = current
        for key, tat in self.tat.items():
            usage.setdefault(key, [0, 0, None])[2] = tat
        return {key: (v[0], v[1], v[2]) for key, v in usage.items()}

    def sweep(self, now: float) -> None:
        """Forget rate states that have run out (a ``tat`` at or before ``now`` admits as a key never
        used does), at most once a second: per-user keys must not pile up forever."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + 1.0
        stale = [key for key, tat in self.tat.items() if tat <= now]
        for key in stale:
            del self.tat[key]

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
