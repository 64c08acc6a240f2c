"""A ready queue shared fairly among tenants (start-time fair queueing).

:class:`FairReadyQueue` has :class:`~.ready.ReadyQueue`'s interface and holds
one ``ReadyQueue`` per tenant (``item[2].tenant``; ``None`` is one more
tenant). :meth:`~FairReadyQueue.pop` takes, among the tenants whose head has
the best priority, the one with the smallest start tag ``S = max(V, F)``
(``V`` the virtual time, ``F`` the tenant's finish tag), then sets ``V = S``
and ``F = S + 1 / weight``. A tenant that returns after idling starts at
``V``: it cannot bank credit. Order within a tenant is its ``ReadyQueue``'s.

Stale heads (``item[2].slot != item[3]``) are dropped without charging. A
job popped and then parked for a limit still charges its tenant. Tags are
not persisted: after a restart every tenant starts level. Each pop costs
O(tenants with ready jobs).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .ready import CHUNK, ReadyItem, ReadyQueue

__all__ = ["FairReadyQueue"]


class FairReadyQueue:
    """Items by priority (desc), then fair share among tenants, then each tenant's own order."""

    def __init__(self, weights: Mapping[str, float], chunk: int = CHUNK) -> None:
        self._weights = dict(weights)
        self._chunk = chunk
        self._tenants: dict[Any, ReadyQueue] = {}
        self._finish: dict[Any, float] = {}
        self._v = 0.0
        #: Items held, stale ones included.
        self.size = 0

    def __iter__(self) -> Iterator[ReadyItem]:
        for ready in self._tenants.values():
            yield from ready

    def push(self, priority: int, item: ReadyItem) -> None:
        tenant = item[2].tenant
        ready = self._tenants.get(tenant)
        if ready is None:
            ready = self._tenants[tenant] = ReadyQueue(self._chunk)
        ready.push(priority, item)
        self.size += 1

    def _choose(self) -> Any:
        """The tenant whose head goes next (``None`` key absent: nothing ready), dropping stale heads."""
        best: tuple[int, float, float, int] | None = None
        chosen: Any = _NONE
        empty = []
        v = self._v
        for tenant, ready in self._tenants.items():
            while (item := ready.first()) is not None and item[2].slot != item[3]:
                ready.pop()
                self.size -= 1
            if item is None:
                empty.append(tenant)
                continue
            start = max(v, self._finish.get(tenant, 0.0))
            key = (-item[2].priority, start, item[0], item[1])
            if best is None or key < best:
                best, chosen = key, tenant
        for tenant in empty:
            del self._tenants[tenant]
        return chosen

    def first(self) -> ReadyItem | None:
        """The item :meth:`pop` would return next, without removing it."""
        tenant = self._choose()
        return None if tenant is _NONE else self._tenants[tenant].first()

    def pop(self) -> ReadyItem | None:
        """Remove and return the next item, charging its tenant (``None`` when empty)."""
        tenant = self._choose()
        if tenant is _NONE:
            return None
        item = self._tenants[tenant].pop()
        self.size -= 1
        start = max(self._v, self._finish.get(tenant, 0.0))
        self._v = start
        self._finish[tenant] = start + 1.0 / self._weights.get(tenant, 1.0) if tenant is not None else start + 1.0
        return item


_NONE: Any = object()
