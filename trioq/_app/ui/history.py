"""Throughput over the last minutes: ``stats()["totals"]`` sampled into a ring, drawn as SVG.

The dashboard's app samples its queue every :data:`SAMPLE_EVERY` seconds
while it serves and keeps the last :data:`KEEP` samples (ten minutes). Rates
are the differences between neighbouring samples: jobs succeeded per second
and failed attempts per second. The totals are this node's (they count since
its queue opened); a total that goes down (the queue was opened again) counts
as a new start, not as a negative rate.
"""

from __future__ import annotations

import collections
import logging
import math
import time

import attrs
import trio

from ..._model import TrioqError
from ..._runtime.queue import Queue

__all__ = ["KEEP", "SAMPLE_EVERY", "Chart", "History", "chart", "sample_forever"]

#: Seconds between two samples.
SAMPLE_EVERY = 3.0
#: Samples kept: ten minutes' worth.
KEEP = 200

_logger = logging.getLogger("trioq.http")


@attrs.frozen
class Rate:
    """The rates between two samples, at the later one's wall time ``at``."""

    at: float
    succeeded: float
    failed: float


class History:
    """The last :data:`KEEP` samples of ``(wall time, totals)``, oldest first."""

    def __init__(self, keep: int = KEEP) -> None:
        self.samples: collections.deque[tuple[float, dict[str, int]]] = collections.deque(maxlen=keep)

    def add(self, at: float, totals: dict[str, int]) -> None:
        """Record ``totals`` as seen at wall time ``at``."""
        self.samples.append((at, dict(totals)))

    def rates(self) -> list[Rate]:
        """Per-second rates between neighbouring samples, oldest first (one fewer than the samples)."""
        out: list[Rate] = []
        for (t0, a), (t1, b) in zip(self.samples, list(self.samples)[1:], strict=False):
            span = t1 - t0
            if span <= 0:
                continue
            out.append(Rate(t1, _per_second(a, b, "succeeded", span), _per_second(a, b, "failed_attempts", span)))
        return out


def _per_second(before: dict[str, int], after: dict[str, int], name: str, span: float) -> float:
    grown = after.get(name, 0) - before.get(name, 0)
    return max(grown, 0) / span


async def sample_forever(queue: Queue, history: History, every: float = SAMPLE_EVERY) -> None:
    """Add a sample of ``queue.stats()["totals"]`` to ``history`` every ``every`` seconds, until
    cancelled or until the queue refuses (it closed: the last samples stay)."""
    while True:
        try:
            stats = await queue.stats()
        except TrioqError as exc:
            _logger.info("dashboard: stopped sampling the queue's totals: %s", exc)
            return
        history.add(time.time(), stats["totals"])
        await trio.sleep(every)


# ------------------------------------------------------------------- the chart

WIDTH, HEIGHT = 640.0, 180.0
#: Room left for the axis labels: left, right, top, bottom.
_LEFT, _RIGHT, _TOP, _BOTTOM = 48.0, 8.0, 10.0, 22.0


@attrs.frozen
class Chart:
    """What the overview's SVG template draws: two polylines' ``points`` attributes, the y axis
    top (``y_max`` per second), tick labels ``(x or y, text)``, and summary figures."""

    succeeded_points: str
    failed_points: str
    y_max: float
    y_ticks: list[tuple[float, str]]
    x_ticks: list[tuple[float, str]]
    minutes: float
    succeeded_per_s: float
    failed_per_s: float
    failure_rate: float | None  # failed attempts / (successes + failed attempts); None: no attempt
    samples: int


def chart(history: History, now: float | None = None) -> Chart | None:
    """The chart of ``history``, or ``None`` before two samples exist."""
    rates = history.rates()
    if not rates:
        return None
    now = time.time() if now is None else now
    first = history.samples[0][0]
    span = max(now - first, 1.0)
    top = _nice(max(max(r.succeeded for r in rates), max(r.failed for r in rates)))
    plot_w, plot_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def x(at: float) -> float:
        return _LEFT + plot_w * (1 - (now - at) / span)

    def y(value: float) -> float:
        return _TOP + plot_h * (1 - value / top)

    def points(values: list[tuple[float, float]]) -> str:
        return " ".join(f"{x(at):.1f},{y(v):.1f}" for at, v in values)

    minutes = span / 60
    step = _tick_step(span)
    x_ticks = [(x(now - back), _ago(back)) for back in _frange(0, span, step)]
    y_ticks = [(y(top * k / 4), _figure(top * k / 4)) for k in range(5)]
    first_totals, last_totals = history.samples[0][1], history.samples[-1][1]
    elapsed = history.samples[-1][0] - first
    done = max(last_totals.get("succeeded", 0) - first_totals.get("succeeded", 0), 0)
    failed = max(last_totals.get("failed_attempts", 0) - first_totals.get("failed_attempts", 0), 0)
    return Chart(
        succeeded_points=points([(r.at, r.succeeded) for r in rates]),
        failed_points=points([(r.at, r.failed) for r in rates]),
        y_max=top,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        minutes=minutes,
        succeeded_per_s=done / elapsed if elapsed > 0 else 0.0,
        failed_per_s=failed / elapsed if elapsed > 0 else 0.0,
        failure_rate=failed / (done + failed) if done + failed else None,
        samples=len(history.samples),
    )


def _nice(value: float) -> float:
    """The smallest of 1, 2 or 5 times a power of ten at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for factor in (1, 2, 5, 10):
        if value <= factor * power:
            return factor * power
    return 10.0 * power  # pragma: no cover - the loop always returns


def _tick_step(span: float) -> float:
    for step in (15.0, 30.0, 60.0, 120.0, 300.0):
        if span / step <= 6:
            return step
    return 600.0


def _frange(start: float, stop: float, step: float) -> list[float]:
    return [start + k * step for k in range(int((stop - start) // step) + 1)]


def _ago(seconds: float) -> str:
    if seconds == 0:
        return "now"
    return f"-{seconds / 60:g}m" if seconds >= 60 else f"-{seconds:g}s"


def _figure(value: float) -> str:
    return f"{value:g}" if value >= 1 or value == 0 else f"{value:.2f}"
