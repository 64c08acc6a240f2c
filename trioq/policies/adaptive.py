"""The controller behind ``Registry.limit(key, max=Adaptive(min, max))``: a cap found from feedback.

One :class:`AdaptiveCap` per concrete key on this node. Each attempt holding
the key says when it starts (:meth:`AdaptiveCap.started`) and, when it ends,
its latency and whether it failed (:meth:`AdaptiveCap.observe`). The cap moves
between ``Adaptive.min`` and ``Adaptive.max``, starting at ``min``:

* failures (an error, a timeout, :class:`~trioq.Overloaded`) multiply it by
  :data:`DECREASE` at once and set ``hold`` (below) back to 1 (a failure
  answering a probe only undoes the probe), the first failure after a change deciding (the ones that
  follow within :data:`SKIP` windows are the echo of the same overload);
* latency (Vegas), once a *window* (the last window's mean latency: about one
  attempt) from the mean latency of the window's successes. ``baseline`` is
  the least window mean seen, rising by :data:`BASELINE_DRIFT` a window so a
  dependency that got slower for good is relearnt; the queue the cap builds at
  the dependency is estimated as ``cap * (1 - baseline / mean)`` (every
  :data:`BASELINE_RESET` windows the baseline is relearnt from the window's
  mean, and a window lasts at most :data:`LONGEST_WINDOW` baselines). Above
  :data:`SHRINK_ABOVE` the cap shrinks by one. Below :data:`GROW_BELOW` it
  grows by one, if the window's attempts in flight reached half the cap (a cap
  nobody fills proves nothing) and the window was the ``hold``-th calm one in a
  row;
* probing: a growth is a probe until ``hold`` calm windows at the new cap
  confirm it; a shrink or a failure before that means it went past capacity,
  and ``hold`` doubles (up to :data:`MAX_HOLD`), so a cap sitting at capacity
  probes ever more rarely. A confirmed growth sets ``hold`` back to 1, so a cap
  far below capacity climbs a step every other window.

After each change the samples of :data:`SKIP` windows are skipped: they started
under the old cap.
"""

from __future__ import annotations

import math

from .._model import Adaptive

__all__ = [
    "BASELINE_DRIFT",
    "BASELINE_RESET",
    "DECREASE",
    "GROW_BELOW",
    "LONGEST_WINDOW",
    "MAX_HOLD",
    "SHRINK_ABOVE",
    "SKIP",
    "AdaptiveCap",
]

#: Multiplier on errors, timeouts and Overloaded (at most once a window).
DECREASE = 0.5
#: Estimated queue (in attempts) under which the cap may grow by one.
GROW_BELOW = 0.5
#: Estimated queue over which the cap shrinks by one.
SHRINK_ABOVE = 0.75
#: How much the baseline (least window mean) rises a window, to follow a dependency that slowed.
BASELINE_DRIFT = 0.01
#: How many windows' worth of samples a change skips (they started under the old cap, some later).
SKIP = 1.5
#: The most calm windows a growth waits for after failed probes.
MAX_HOLD = 32
#: Every this many windows the baseline is set to the window's mean: a baseline learnt from a burst
#: of early returns (a cache hit, "already done") would otherwise keep the cap down for hours.
BASELINE_RESET = 64
#: A window lasts at most this many baselines: one very slow success does not freeze the cap.
LONGEST_WINDOW = 4.0


class AdaptiveCap:
    """The moving cap of one key; :attr:`cap` is an int in ``[spec.min, spec.max]``, starting at ``min``.

    Times are the caller's clock (``trio.current_time()``).
    """

    def __init__(self, spec: Adaptive) -> None:
        self.spec = spec
        self._cap = spec.min
        self._baseline = math.inf
        self._window = 0.0  # the last window's mean latency: how long a window lasts
        self._start = -math.inf  # when the current window began (samples before it are skipped)
        self._sum = 0.0
        self._n = 0
        self._inflight = 0
        self._peak = 0  # most attempts in flight during the window
        self._hold = 1
        self._calm = 0  # calm windows in a row since the last change
        self._probing = False  # the last change was a growth not yet confirmed
        self._windows = 0  # windows decided (for BASELINE_RESET)
        #: When an attempt last started or ended (the book forgets a cap idle long enough).
        self.last_seen = -math.inf

    @property
    def cap(self) -> int:
        """The current cap (how many attempts may hold the key at once)."""
        return self._cap

    @property
    def inflight(self) -> int:
        """Attempts started and not yet observed."""
        return self._inflight

    def started(self) -> None:
        """An attempt holding the key started (every start is followed by one :meth:`observe`)."""
        self._inflight += 1
        if self._inflight > self._peak:
            self._peak = self._inflight

    def observe(self, now: float, latency: float, *, failed: bool = False) -> None:
        """An attempt ended at ``now`` after ``latency`` seconds; ``failed``: error, timeout or Overloaded.

        A latency that is not a finite number >= 0 (an attempt whose outcome was decided
        elsewhere: ``math.nan``) only ends the attempt.
        """
        if self._inflight > 0:
            self._inflight -= 1
        self.last_seen = now
        if now < self._start:
            return  # started under the cap before the last change
        if failed:
            self._failed(now)
            return
        if not (math.isfinite(latency) and latency >= 0):
            return
        self._sum += latency
        self._n += 1
        if now - self._start >= self._window:
            self._decide(now)

    def overloaded(self, now: float) -> None:
        """An explicit overload signal, as a failed attempt's."""
        if now >= self._start:
            self._failed(now)

    def _failed(self, now: float) -> None:
        if self._probing:  # the probe's answer: undo it
            self._hold = min(MAX_HOLD, self._hold * 2)
            self._change(now, self._cap - 1)
        else:  # a real overload: cut, and climb back quickly (latency will stop the climb at capacity)
            self._hold = 1
            self._change(now, math.floor(self._cap * DECREASE))

    def _decide(self, now: float) -> None:
        mean = self._sum / self._n
        self._windows += 1
        if self._baseline <= 0 or self._windows % BASELINE_RESET == 0:
            self._baseline = mean  # relearnt (a zero baseline, from a coarse clock, would never rise)
        else:
            self._baseline = min(mean, self._baseline * (1 + BASELINE_DRIFT))
        self._window = min(mean, LONGEST_WINDOW * self._baseline) if self._baseline > 0 else mean
        queue = self._cap * (1 - self._baseline / mean) if mean > 0 else 0.0
        if queue > SHRINK_ABOVE:
            if self._probing:
                self._hold = min(MAX_HOLD, self._hold * 2)
            self._change(now, self._cap - 1)
            return
        if queue < GROW_BELOW and 2 * self._peak >= self._cap:
            self._calm += 1
            if self._probing and self._calm >= self._hold:  # the growth held: the capacity was there
                self._probing = False
                self._hold = 1
            if not self._probing and self._calm >= self._hold and self._cap < self.spec.max:
                self._change(now, self._cap + 1)
                self._probing = True
                return
        self._next_window(now)

    def _change(self, now: float, cap: int) -> None:
        self._cap = min(self.spec.max, max(self.spec.min, cap))
        self._calm = 0
        self._probing = False
        self._next_window(now + SKIP * self._window)  # skip the samples in flight under the old cap

    def _next_window(self, start: float) -> None:
        self._start = start
        self._sum = 0.0
        self._n = 0
        self._peak = self._inflight
