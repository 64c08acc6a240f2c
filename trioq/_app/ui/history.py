"""Throughput over the last minutes: ``stats()["totals"]`` sampled into a ring, drawn as SVG.

The dashboard's app samples its queue every :data:`SAMPLE_EVERY` seconds
while it serves and keeps the last :data:`KEEP` samples (ten minutes). Rates
are the differences between neighbouring samples: jobs succeeded per second
and failed attempts per second. The totals are this node's (they count since
its queue opened); a total that goes down (the queue was opened again) counts
from zero again, never as a negative rate.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import time

import attrs
import trio

from ..._model import TrioqError
from ..._runtime.queue import Queue

__all__ = ["KEEP", "SAMPLE_EVERY", "Chart", "History", "Step", "chart", "sample_forever"]

#: Seconds between two samples.
SAMPLE_EVERY = 3.0
#: Samples kept: ten minutes' worth.
KEEP = 200

_logger = logging.getLogger("trioq.http")


@attrs.frozen
class Step:
    """What happened between two neighbouring samples: from ``span`` seconds before ``at`` to ``at``,
    ``succeeded`` jobs succeeded and ``failed`` attempts failed (never negative)."""

    at: float
    span: float
    succeeded: int
    failed: int

    @property
    def succeeded_per_s(self) -> float:
        """Jobs succeeded per second over the step."""
        return self.succeeded / self.span

    @property
    def failed_per_s(self) -> float:
        """Attempts failed per second over the step."""
        return self.failed / self.span


class History:
    """The last :data:`KEEP` samples of ``(wall time, totals)``, oldest first."""

    def __init__(self, keep: int = KEEP) -> None:
        self.samples: collections.deque[tuple[float, dict[str, int]]] = collections.deque(maxlen=keep)

    def add(self, at: float, totals: dict[str, int]) -> None:
        """Record ``totals`` as seen at wall time ``at``."""
        self.samples.append((at, dict(totals)))

    def steps(self) -> list[Step]:
        """The steps between neighbouring samples, oldest first (one fewer than the samples)."""
        out: list[Step] = []
        for (t0, a), (t1, b) in itertools.pairwise(self.samples):
            if t1 > t0:
                out.append(Step(t1, t1 - t0, _grown(a, b, "succeeded"), _grown(a, b, "failed_attempts")))
        return out


def _grown(before: dict[str, int], after: dict[str, int], name: str) -> int:
    """How much the total ``name`` grew; a total that went down was reset (its queue opened again):
    it grew by its new value since."""
    now, then = after.get(name, 0), before.get(name, 0)
    return now - then if now >= then else now


async def sample_forever(queue: Queue, history: History, every: float = SAMPLE_EVERY) -> None:
    """Add a sample of ``queue.stats()["totals"]`` to ``history`` every ``every`` seconds, until
    cancelled or until the queue refuses (it closed: the last samples stay). Any other error of a
    sample is logged and sampling goes on: this runs in the serving app's nursery, which an error
    escaping from here would end (a page's error is that page's alone)."""
    while True:
        try:
            stats = await queue.stats()
            history.add(time.time(), stats["totals"])
        except TrioqError as exc:
            _logger.info("dashboard: stopped sampling the queue's totals: %s", exc)
            return
        except Exception:
            _logger.exception("dashboard: a sample of the queue's totals failed; sampling goes on")
        await trio.sleep(every)


# ------------------------------------------------------------------- the chart

WIDTH, HEIGHT = 640.0, 180.0
#: Room left for the axis labels: left, right, top, bottom.
_LEFT, _RIGHT, _TOP, _BOTTOM = 48.0, 16.0, 10.0, 22.0


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
    steps = history.steps()
    if not steps:
        return None
    now = time.time() if now is None else now
    first = history.samples[0][0]
    span = max(now - first, 1.0)
    top = _nice(max(max(step.succeeded_per_s, step.failed_per_s) for step in steps))
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
    y_ticks = [(y(top * k / 5), _figure(top * k / 5)) for k in range(6)]
    elapsed = sum(step.span for step in steps)
    done = sum(step.succeeded for step in steps)
    failed = sum(step.failed for step in steps)
    return Chart(
        succeeded_points=points([(step.at, step.succeeded_per_s) for step in steps]),
        failed_points=points([(step.at, step.failed_per_s) for step in steps]),
        y_max=top,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
        minutes=minutes,
        succeeded_per_s=done / elapsed,
        failed_per_s=failed / elapsed,
        failure_rate=failed / (done + failed) if done + failed else None,
        samples=len(history.samples),
    )


def _nice(value: float) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten at or above ``value`` (at least 1): five
    grid steps of it are round numbers."""
    if value <= 1:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for factor in (1.0, 2.0, 2.5, 5.0):
        if value <= factor * power:
            return factor * power
    return 10.0 * power


def _tick_step(span: float) -> float:
    """Seconds between x ticks: at most about six over ``span``."""
    for step in (15.0, 30.0, 60.0, 120.0, 300.0):
        if span / step <= 6:
            return step
    return 600.0


def _frange(start: float, stop: float, step: float) -> list[float]:
    """``start``, ``start + step``, ... up to ``stop`` included."""
    return [start + k * step for k in range(int((stop - start) // step) + 1)]


def _ago(seconds: float) -> str:
    """An x tick's label: ``now``, ``-45s``, ``-2m``, ``-1m15s``."""
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f"-{rest}s" if rest else "now"
    return f"-{minutes}m{rest:02d}s" if rest else f"-{minutes}m"


def _figure(value: float) -> str:
    """A y tick's label: ``12.5``, ``0.20``."""
    return f"{value:g}" if value >= 1 or value == 0 else f"{value:.2f}"
