"""The completer: attempts' outcomes to ``store.complete``, and the lease on running jobs.

With an in-process store (``Store.batch_outcomes`` false) each outcome is
completed inline by the worker that made it, before it claims again: that
call costs less than a hand-off to another task would, and keeps a drain's
start latency. With a store whose every call is a round trip, workers hand
their outcomes over and move on; :meth:`Completer.run` sends what gathered
as one batch (River's batch completer), the next batch while the previous
one is in flight. An outcome handed over is recorded, whatever cancels the
worker or the completer meanwhile (shutdown's end, a crash of the pool).

:meth:`Completer.extend_leases` renews the node's lease on its running jobs
every third of the lease; a job the store says is no longer held (cancelled
by another node, rescued) has its attempt stopped: the fallback for a lost
``on_cancel`` hint. A node that cannot renew in time (the store unreachable,
an outage) fences itself: its attempts stop before its lease can lapse,
rather than run on beside the node that rescues their jobs.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence

import trio

from .._model import Job, JobState
from ..stores._base import Outcome, Released, Snoozed, Store, Succeeded
from .logs import debug_enabled as _debug
from .logs import log, log_outcome
from .totals import Totals

__all__ = ["Completer"]

_SUCCEEDED = JobState.SUCCEEDED
_DEAD = JobState.DEAD
#: The share of the lease a node keeps in hand: it stops its attempts this long before its lease could
#: lapse (the time the cancels take to land, and other nodes' clocks running a little ahead).
FENCE_MARGIN = 0.1


class Completer:
    """See the module docstring. ``on_outcome()`` is called after each batch that changed a job
    (``Queue.join`` looks again); ``on_lost(job_id, epoch)`` for each held job the store no
    longer gives this node."""

    def __init__(
        self,
        store: Store,
        *,
        totals: Totals,
        node: str,
        lease: float,
        on_outcome: Callable[[], None],
        on_lost: Callable[[str, int], None],
    ) -> None:
        self._store = store
        self._totals = totals
        self._node = node
        self._lease = lease
        self._on_outcome = on_outcome
        self._on_lost = on_lost
        self.batched = bool(getattr(store, "batch_outcomes", False))
        self._pending: list[tuple[Outcome, Job, float]] = []
        self._gathered = trio.Event()
        self._idle = trio.Event()
        self._idle.set()
        self._keep = lease * (1 - FENCE_MARGIN)  # how long a renewal vouches for the lease, from when it went out
        self._confirmed = -math.inf  # when the last renewal that came back was sent (trio's clock)
        self._renewed = trio.Event()  # set (and replaced) at each renewal that comes back

    async def complete(self, outcome: Outcome, job: Job, started: float) -> None:
        """Record ``outcome`` of the attempt of ``job`` (as claimed) that began at ``started``
        (``perf_counter()``): inline, or handed to :meth:`run`'s next batch."""
        if not self.batched:
            with trio.CancelScope(shield=True):  # see _send
                states = await self._store.complete((outcome,))
            self.count(outcome, states[0], job, started)
            return
        self._pending.append((outcome, job, started))
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._gathered.set()

    async def run(self) -> None:
        """Send gathered outcomes in batches until cancelled (batched mode only); a cancel
        first sends what is still gathered, shielded."""
        if not self.batched:
            return
        try:
            while True:
                await self._gathered.wait()
                await self._send()
        finally:
            await self.drain()

    async def drain(self) -> None:
        """Send what is still gathered, shielded (the pool's last step: nothing is handed over after it)."""
        with trio.CancelScope(shield=True):
            while self._pending:
                await self._send()

    async def flush(self) -> None:
        """Until every outcome handed over so far is sent (at once, inline)."""
        while self._pending or not self._idle.is_set():
            await self._idle.wait()

    async def _send(self) -> None:
        self._gathered = trio.Event()
        batch, self._pending = self._pending, []
        if batch:
            # Shielded: an outcome handed over is recorded even when a cancel (the end of the
            # shutdown grace) comes while the store call waits to start; dropped, it would leave
            # its job running, for the session's end to release and another node to run again.
            with trio.CancelScope(shield=True):
                states = await self._store.complete([outcome for outcome, _, _ in batch])
            for (outcome, job, started), state in zip(batch, states, strict=True):
                self.count(outcome, state, job, started)
        if not self._pending:
            self._idle.set()

    def count(self, outcome: Outcome, state: JobState | None, job: Job, started: float) -> None:
        """Count an outcome the store applied (``state``: the job's state now; ``None``: refused) in the
        totals, log it, and tell ``on_outcome``. ``started``: ``perf_counter()`` at the attempt's start."""
        if state is None:
            return  # refused: the job was cancelled, rescued or finished by someone else
        totals = self._totals
        kind = type(outcome)
        if kind is Succeeded and state is _SUCCEEDED:
            totals.succeeded += 1
            if _debug():
                log_outcome(job, outcome, state, started)
        elif kind is Released:
            totals.released += 1
            return
        else:
            if kind is Snoozed and state is not _DEAD:
                totals.snoozed += 1
            else:  # a failure (past MAX_SNOOZES a snooze kills: one too)
                totals.failed_attempts += 1
                if state is _DEAD:
                    totals.dead += 1
                else:
                    totals.retried += 1
            log_outcome(job, outcome, state, started)
        self._on_outcome()

    async def extend_leases(
        self,
        held: Callable[[], Sequence[tuple[str, int]]],
        on_lapsed: Callable[[list[tuple[str, int]]], Awaitable[None]],
    ) -> None:
        """Every third of the lease, renew it on the jobs ``held()`` names (with none held too: the
        node's heartbeat); runs until cancelled.

        The fence: when no renewal sent in the last lease (less :data:`FENCE_MARGIN` of it) has come
        back, another node may rescue this node's jobs at any moment, so ``on_lapsed(held())`` stops
        their attempts and gives them back, while the renewal may still be retrying. It arms again at
        the next renewal that comes back in time; jobs claimed in between are not fenced. Renewals go
        out every third of the lease counted from when the last one went out, so a store that takes
        up to 45% of the lease to answer never sets the fence off; one that takes longer does, every
        cycle, as its lease may lapse (a longer lease is the cure). A renewal that comes back too late to
        count (it waited out an outage) is followed at once by another.
        """
        every = self._lease / 3
        self._confirmed = trio.current_time()  # the session's open registered the node just now
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fence, held, on_lapsed)
            due = self._confirmed + every
            while True:
                await trio.sleep_until(due)
                pairs = list(held())
                sent = trio.current_time()
                answers = await self._store.extend(self._node, pairs, self._lease)
                if trio.current_time() < sent + self._keep:  # it still vouches for the lease
                    self._confirmed = max(self._confirmed, sent)
                    self._renewed.set()
                    self._renewed = trio.Event()
                    due = sent + every
                else:
                    due = trio.current_time()
                for (job_id, epoch), still in zip(pairs, answers, strict=True):
                    if not still:
                        self._on_lost(job_id, epoch)

    async def _fence(
        self,
        held: Callable[[], Sequence[tuple[str, int]]],
        on_lapsed: Callable[[list[tuple[str, int]]], Awaitable[None]],
    ) -> None:
        """See :meth:`extend_leases`."""
        while True:
            confirmed = self._confirmed
            await trio.sleep_until(confirmed + self._keep)
            if self._confirmed != confirmed:
                continue  # renewed meanwhile
            pairs = list(held())
            if pairs:
                log.warning(
                    "trioq: node %s could not renew its lease for %.1f s (the store is unreachable?): "
                    "stopping its %d attempts and giving their jobs back before another node may take them",
                    self._node, trio.current_time() - confirmed, len(pairs),
                )  # fmt: skip
                await on_lapsed(pairs)
            while self._confirmed == confirmed:
                await self._renewed.wait()
