"""Plain data of trioq: jobs, their states, retry policy and errors.

Nothing here does I/O or imports trio, so the state machine (``_table``) and
every store can share these types.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any, TypeGuard

import attrs

__all__ = [
    "Backoff",
    "InvalidJob",
    "Job",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "QueueFull",
    "SimulatedCrash",
    "TrioqError",
    "UnknownTask",
]


class TrioqError(Exception):
    """Base class of every error trioq raises on purpose."""


class UnknownTask(TrioqError, LookupError):
    """The task name is not in the queue's registry."""


class InvalidJob(TrioqError, ValueError):
    """A job's fields are malformed; ``field`` names the offending one."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class JobNotFound(TrioqError, LookupError):
    """No job with that id exists (never did, or was evicted after retention)."""


class QueueFull(TrioqError):
    """The queue holds ``max_ready`` ready jobs; try again after ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SimulatedCrash(TrioqError):
    """The queue died as if killed with ``kill -9`` (``trioq.testing.FaultPlan.crash``).

    Raised out of ``open_queue`` after a fault plan's crash point: nothing more
    was written, released or checkpointed. Open the same store again to recover.
    """


class JobState(enum.StrEnum):
    """Where a job is in its life. ``JobState.DEAD == "dead"`` holds."""

    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True for ``SUCCEEDED``, ``DEAD`` and ``CANCELLED``: nothing more will run."""
        return self in _TERMINAL


_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED})


def _check_positive(name: str, value: float, *, allow_zero: bool) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidJob(f"{name} must be a number, got {value!r}", field=name)
    if value != value or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidJob(f"{name} must be {bound}, got {value!r}", field=name)


@attrs.frozen
class Backoff:
    """Exponential backoff with jitter between attempts of a failing job.

    The delay after attempt *n* (1-based) is
    ``min(max, base * factor ** (n - 1)) * (1 + U(0, jitter))``, where ``U`` is a
    uniform random draw. ``jitter=0`` gives exact, deterministic delays.
    """

    base: float = 0.5
    factor: float = 2.0
    max: float = 300.0
    jitter: float = 0.5

    def __attrs_post_init__(self) -> None:
        _check_positive("backoff.base", self.base, allow_zero=True)
        _check_positive("backoff.max", self.max, allow_zero=True)
        _check_positive("backoff.jitter", self.jitter, allow_zero=True)
        if not isinstance(self.factor, int | float) or self.factor < 1:
            raise InvalidJob(f"backoff.factor must be >= 1, got {self.factor!r}", field="backoff.factor")

    def delay(self, attempt: int, draw: float) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        ``draw`` is a uniform random number in [0, 1); passing it in keeps this
        pure and lets tests pin it.
        """
        exponent = max(attempt - 1, 0)
        try:
            raw = self.base * self.factor**exponent
        except OverflowError:
            raw = self.max
        return min(self.max, raw) * (1.0 + self.jitter * draw)


@attrs.frozen
class JobSpec:
    """A job to enqueue with :meth:`Queue.enqueue_many`; fields as in :meth:`Queue.enqueue`."""

    task: str
    payload: dict[str, Any] = attrs.field(factory=dict)
    delay: float = 0.0
    priority: int | None = None
    key: str | None = None
    max_attempts: int | None = None


@attrs.frozen
class Job:
    """A snapshot of one job, as the store saw it when asked.

    Times (``run_at``, ``created_at``, ``finished_at``) are wall-clock seconds
    since the epoch. ``attempts`` counts attempts that ended (success, error,
    hang, timeout); one cut off by a crash or shutdown is not counted.
    ``epoch`` grows with every claim; only the holder of the current epoch can
    complete a running job. ``error`` is the last error as ``"Type: message"``.
    """

    id: str
    task: str
    payload: dict[str, Any]
    state: JobState
    attempts: int
    epoch: int
    priority: int
    key: str | None
    max_attempts: int
    run_at: float
    created_at: float
    finished_at: float | None
    result: Any
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        """The job as a JSON-ready dict (``state`` as its string value)."""
        data = attrs.asdict(self, recurse=False)
        data["state"] = self.state.value
        return data


#: Types whose values always survive a JSON round trip (exact types: a
#: subclass such as an ``IntEnum`` takes the full check).
_PLAIN = frozenset({str, int, bool, type(None)})
#: The ints the stores can hold (msgpack: signed or unsigned 64 bits).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def is_storable_int(value: Any, minimum: int = INT_MIN) -> TypeGuard[int]:
    """Whether ``value`` is an int (not a bool) from ``minimum`` to :data:`INT_MAX`: what the stores hold."""
    return not isinstance(value, bool) and isinstance(value, int) and minimum <= value <= INT_MAX


def check_json(value: Any, *, what: str) -> None:
    """Raise :class:`InvalidJob` unless ``value`` survives a JSON round trip.

    A flat dict of strings, 64-bit ints, bools, ``None`` and finite floats
    under string keys (the common payload) is checked without encoding it.
    """
    if type(value) is dict:
        for k, v in value.items():
            t = type(v)
            if type(k) is not str:
                break
            if t in _PLAIN:
                if t is int and not INT_MIN <= v <= INT_MAX:
                    break  # the full check decides (and the store refuses it later)
            elif t is not float or not math.isfinite(v):
                break
        else:
            return
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidJob(f"{what} must be JSON-serialisable: {exc}", field=what) from None


def error_text(exc: BaseException) -> str:
    """The ``"Type: message"`` form stored in :attr:`Job.error`."""
    message = str(exc)
    name = type(exc).__qualname__
    return f"{name}: {message}" if message else name
