"""The node's counters since its queue opened (``Queue.stats()["totals"]``)."""

from __future__ import annotations

import attrs

__all__ = ["Totals"]


@attrs.define
class Totals:
    """Counters since the queue opened (see :meth:`Queue.stats`).

    ``failed_attempts`` counts every failed attempt (errors, hangs, timeouts,
    ``NoRetry``); of those, ``retried`` ran again and ``dead`` did not.
    ``snoozed`` counts ``trioq.Snooze`` s (not failures).
    """

    enqueued: int = 0
    succeeded: int = 0
    failed_attempts: int = 0
    retried: int = 0
    dead: int = 0
    timed_out: int = 0
    hung: int = 0
    stuck: int = 0
    cancelled: int = 0
    released: int = 0
    snoozed: int = 0
