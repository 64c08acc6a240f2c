"""Plain data of trioq: jobs, their states, retry policy and errors.

Nothing here does I/O or imports trio, so the state machine (``_table``) and
every store can share these types.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import attrs

__all__ = [
    "Backoff",
    "FailedAttempt",
    "InvalidJob",
    "Job",
    "Limit",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "NoRetry",
    "QueueFull",
    "Snooze",
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


class NoRetry(TrioqError):
    """Raise in a handler to fail the job for good: it goes ``dead`` now.

    The attempt counts (``attempts`` grows by one) and the job's ``error`` is
    ``"NoRetry: <reason>"``. For errors a retry cannot fix: bad input, a
    missing record. ``@registry.task(no_retry=(ValueError, ...))`` does the
    same for exception types a handler raises.
    """

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class Overloaded(TrioqError):
    """Raise in a handler when its dependency is over capacity: the attempt fails as any error does
    (counted, retried with backoff), and every :class:`Adaptive` limit key the job holds takes it as
    an explicit overload signal and lowers its cap at once. The job's ``error`` is
    ``"Overloaded: <reason>"``.
    """

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class Snooze(TrioqError):
    """Raise in a handler to run the job again after ``seconds``, as if it had not started.

    A snooze is not a failure: ``attempts`` does not grow and it never counts
    against ``max_attempts``; ``error`` stays as it was. What bounds endless
    snoozing is :data:`MAX_SNOOZES`: the job snoozed that many times since it
    was enqueued (or retried) goes ``dead`` at its next snooze, its error
    saying so. ``seconds`` must be a finite number >= 0 (else the attempt
    fails with an ``InvalidJob`` error, counted as any failure).
    """

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snoozed for {seconds!r}s")
        self.seconds = seconds

    def __reduce__(self) -> tuple[type[Snooze], tuple[float]]:
        # From a worker process it comes back pickled: rebuilt from seconds, not the message.
        return (Snooze, (self.seconds,))


#: The longest retry delay a Backoff gives, in seconds (100 years): past it, "never" in practice,
#: and every store's clock arithmetic stays finite.
MAX_DELAY = 100 * 365.25 * 86400.0
#: Snoozes a job may take (since its enqueue or its last retry) before its next one kills it.
MAX_SNOOZES = 1000
#: Failed attempts a job keeps in ``Job.errors`` (the most recent ones).
MAX_ERRORS_KEPT = 10


@attrs.frozen
class FailedAttempt:
    """One failed attempt of a job, as ``Job.errors`` keeps it.

    ``attempt`` is the attempt's number (1-based), ``error`` its error as
    ``"Type: message"`` (as ``Job.error``), ``traceback`` the formatted
    traceback where the failure was an exception in the handler (``None`` for
    a hang, a timeout, an unknown task), ``finished_at`` wall-clock seconds.
    Texts are cut at :data:`MAX_ERROR_CHARS`.
    """

    attempt: int
    error: str
    traceback: str | None
    finished_at: float


class JobState(enum.StrEnum):
    """Where a job is in its life. ``JobState.DEAD == "dead"`` holds."""

    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    #: Enqueued past ``open_queue(max_ready=N, overflow="defer")``: kept, not claimable, admitted
    #: (to ``READY`` or ``SCHEDULED``) oldest first as the ready and scheduled jobs drop below ``N``.
    DEFERRED = "deferred"
    #: Enqueued with ``after=`` parents not all succeeded yet: kept, not claimable; ready (or
    #: scheduled) once the last parent succeeds, cancelled once any parent ends dead or cancelled.
    WAITING = "waiting"

    @property
    def terminal(self) -> bool:
        """True for ``SUCCEEDED``, ``DEAD`` and ``CANCELLED``: nothing more will run."""
        return self in _TERMINAL


_TERMINAL = frozenset({JobState.SUCCEEDED, JobState.DEAD, JobState.CANCELLED})


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
        from ._validate import number  # it imports this module

        for name in ("base", "max", "jitter"):
            number(f"backoff.{name}", getattr(self, name), infinite=True)
        number("backoff.factor", self.factor, minimum=1.0, infinite=True)

    def delay(self, attempt: int, draw: float) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        ``draw`` is a uniform random number in [0, 1); passing it in keeps this
        pure and lets tests pin it. Never more than :data:`MAX_DELAY` (infinite
        or huge settings, ``max=math.inf`` among them, reach that and stay).
        """
        exponent = max(attempt - 1, 0)
        try:
            raw = self.base * self.factor**exponent
        except OverflowError:
            raw = self.max
        delay = min(self.max, raw) * (1.0 + self.jitter * draw)
        return delay if 0.0 <= delay <= MAX_DELAY else (0.0 if delay < 0.0 else MAX_DELAY)


#: How early (seconds) a rate's token may be taken: float rounding, never a real allowance.
RATE_SLACK = 1e-6


@attrs.frozen
class Limit:
    """What one limit key allows: at most ``max`` attempts holding it at once, and (with ``rate``)
    at most ``burst + rate * w / per`` attempts starting under it in any window of ``w`` seconds.

    The rate is a GCRA (a token bucket in one number per key, its theoretical
    arrival time ``tat``): one start every ``per / rate`` seconds, ``burst``
    (default 1) of them at once after an idle spell. ``None`` for ``max`` or
    ``rate`` means no bound of that kind. Checked by ``Registry.limit``.
    """

    key: str
    max: int | None = None
    rate: float | None = None
    per: float = 1.0
    burst: int | None = None

    @property
    def interval(self) -> float:
        """Seconds between starts at the steady rate (``inf`` without a rate)."""
        return math.inf if self.rate is None else self.per / self.rate

    @property
    def tolerance(self) -> float:
        """How far ahead of now the bucket may run: ``(burst - 1)`` intervals (0 without a rate)."""
        if self.rate is None:
            return 0.0
        return ((1 if self.burst is None else self.burst) - 1) * self.interval

    def admit(self, tat: float, now: float) -> float | None:
        """The key's next ``tat`` if an attempt may start at ``now`` (its token taken), else ``None``.

        ``tat`` is the key's current theoretical arrival time (``-inf`` for a
        key never used). Without a rate every start is admitted. A start up to
        :data:`RATE_SLACK` early is admitted: wall-clock times near 1.7e9 s
        carry only ~0.2 µs of precision, and a token due "now" must not be
        refused for a rounding error.
        """
        if self.rate is None:
            return tat
        at = tat if tat > now else now
        if at - now > self.tolerance + RATE_SLACK:
            return None
        return at + self.interval

    def due(self, tat: float, now: float) -> float:
        """The earliest time :meth:`admit` admits a start, given ``tat`` (``now`` or later)."""
        if self.rate is None:
            return now
        return max(now, tat - self.tolerance)


@attrs.frozen
class Adaptive:
    """A concurrency cap found from feedback, for ``Registry.limit(key, max=Adaptive(min, max))``.

    The key's cap starts at ``min`` and moves between ``min`` and ``max`` (integers,
    ``1 <= min <= max``) from what the attempts holding it observe on this node: their
    latency, errors, timeouts and :class:`Overloaded`. ``max`` is the hard bound that
    invariant 8 holds; the moving cap is this node's (with many nodes each runs its own
    controller over the same global slots).
    """

    min: int = 1
    max: int = 8

    def __attrs_post_init__(self) -> None:
        for name in ("min", "max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Adaptive {name} must be an int, got {type(value).__name__}")
        if self.min < 1:
            raise ValueError(f"Adaptive min must be >= 1, got {self.min!r}")
        if self.max < self.min:
            raise ValueError(f"Adaptive max must be >= min ({self.min}), got {self.max!r}")


@attrs.frozen
class JobSpec:
    """A job to enqueue with :meth:`Queue.enqueue_many`; fields as in :meth:`Queue.enqueue`."""

    task: str
    payload: dict[str, Any] = attrs.field(factory=dict)
    delay: float = 0.0
    priority: int | None = None
    key: str | None = None
    max_attempts: int | None = None
    queue: str | None = None
    tenant: str | None = None
    deadline: float | None = None
    limits: Sequence[str] = ()
    after: Sequence[str | int] = ()


@attrs.frozen
class Job:
    """A snapshot of one job, as the store saw it when asked.

    Times (``run_at``, ``created_at``, ``finished_at``) are wall-clock seconds
    since the epoch. ``attempts`` counts attempts that ended (success, error,
    hang, timeout); one cut off by a crash or shutdown is not counted.
    ``epoch`` grows with every claim; only the holder of the current epoch can
    complete a running job. ``error`` is the last error as ``"Type: message"``;
    ``errors`` holds the last :data:`MAX_ERRORS_KEPT` failed attempts, oldest
    first (:class:`FailedAttempt`), kept across retries. ``queue`` is the
    named queue it waits in (``"default"`` unless its task or its enqueue
    named another); ``tenant`` whom it runs for (``None``: nobody named);
    ``deadline`` the wall-clock time by which it must have started, else it
    is cancelled (``None``: no deadline); ``limits`` the limit keys it holds
    while it runs (its task's, filled from its payload, and its enqueue's);
    ``after`` the ids of the parents it waits for (``WAITING`` until they all succeed).
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
    errors: tuple[FailedAttempt, ...] = ()
    queue: str = "default"
    tenant: str | None = None
    deadline: float | None = None
    limits: tuple[str, ...] = ()
    after: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The job as a JSON-ready dict (``state`` as its string value)."""
        data = attrs.asdict(self, recurse=False)
        data["state"] = self.state.value
        data["errors"] = [attrs.asdict(e) for e in self.errors]
        data["limits"] = list(self.limits)
        data["after"] = list(self.after)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        """The snapshot :meth:`to_dict` made ``data`` of (as the HTTP API sends it); keys it does not
        know (``explain``, ``duplicate``) are ignored. Raises ``KeyError``, ``TypeError`` or
        ``ValueError`` for a dict that is not such a job."""
        fields = {f.name for f in attrs.fields(cls)}
        known = {name: value for name, value in data.items() if name in fields}
        known["state"] = JobState(known["state"])
        known["errors"] = tuple(FailedAttempt(**e) for e in known.get("errors", ()))
        known["limits"] = tuple(known.get("limits", ()))
        known["after"] = tuple(known.get("after", ()))
        return cls(**known)


#: Types whose values always survive a JSON round trip (exact types: a
#: subclass such as an ``IntEnum`` takes the full check).
_PLAIN = frozenset({str, int, bool, type(None)})
#: The ints the stores can hold (msgpack: signed or unsigned 64 bits).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
#: The largest ``priority`` and ``max_attempts``: every store keeps them as signed 64-bit integers
#: (PostgreSQL's ``bigint``), payload ints aside.
INT64_MAX = 2**63 - 1
#: The largest payload, and the largest result, a store holds: 256 MiB, as
#: msgpack (about the size of the JSON). Every transition is one log record, and
#: a checkpoint's record of a job holds its payload and result together: both at
#: their limit still fit the WAL's 1 GiB record (and PostgreSQL's jsonb limit is 256 MiB).
MAX_VALUE_BYTES = 1 << 28
#: The longest task name or idempotency key, in UTF-8 bytes.
MAX_NAME_BYTES = 4096
#: The longest queue or tenant name, in UTF-8 bytes (they key statistics, URLs and indexes).
MAX_LABEL_BYTES = 255
#: The most parents one job may wait for (``after``).
MAX_PARENTS = 1000
#: The queue a job waits in when neither its task nor its enqueue names one.
DEFAULT_QUEUE = "default"
#: How deep a payload or result may nest (dicts and lists), like serde_json's default: every
#: store, and every step that decodes one again (a checkpoint, a worker's claim), then stays
#: far from the recursion limit, wherever on the stack it runs.
MAX_DEPTH = 128
#: The longest error text a store keeps, in characters; beyond it the text is cut, saying so.
MAX_ERROR_CHARS = 16_384


def is_storable_int(value: Any, minimum: int = INT_MIN, maximum: int = INT_MAX) -> TypeGuard[int]:
    """Whether ``value`` is an int (not a bool) from ``minimum`` to ``maximum`` (:data:`INT_MAX`: what the
    stores hold)."""
    return not isinstance(value, bool) and isinstance(value, int) and minimum <= value <= maximum


def name_problem(value: str) -> str | None:
    """Why the stores cannot hold the string ``value`` as a task name or key, or ``None`` if they can.

    Refused: lone surrogates (not UTF-8, so no log or database can hold them),
    NUL characters (PostgreSQL's text cannot), and more than
    :data:`MAX_NAME_BYTES` bytes of UTF-8.
    """
    if value.isascii():
        size = len(value)
    else:
        try:
            size = len(value.encode())
        except UnicodeEncodeError as exc:
            return f"it holds a lone surrogate {value[exc.start]!r} at index {exc.start}, which is not UTF-8"
    if "\x00" in value:
        return f"it holds a NUL character at index {value.index(chr(0))}"
    if size > MAX_NAME_BYTES:
        return f"it is {size} bytes of UTF-8; the limit is {MAX_NAME_BYTES}"
    return None


def label_problem(value: object) -> str | None:
    """Why ``value`` cannot name a queue or a tenant, or ``None`` if it can: a non-empty string the
    stores hold (:func:`name_problem`) of at most :data:`MAX_LABEL_BYTES` bytes of UTF-8."""
    if not isinstance(value, str):
        return f"it must be a string, got {type(value).__name__}"
    if not value:
        return "it is empty"
    problem = name_problem(value)
    if problem is not None:
        return problem
    size = len(value.encode())
    if size > MAX_LABEL_BYTES:
        return f"it is {size} bytes of UTF-8; the limit is {MAX_LABEL_BYTES}"
    return None


#: How the error of a job cancelled for its deadline begins (its type, as in ``"Type: message"``).
DEADLINE_ERROR_PREFIX = "DeadlineExpired:"


def deadline_error(created_at: float, deadline: float) -> str:
    """The error of a job cancelled because it had not started by its ``deadline`` (every store's text)."""
    return f"{DEADLINE_ERROR_PREFIX} not started within {deadline - created_at:.6g} s of its enqueue (its deadline)"


def storable_text(text: str) -> str:
    """``text`` made fit for a store's error field: lone surrogates and NULs
    escaped as backslash sequences, cut to at most :data:`MAX_ERROR_CHARS`
    characters (a note saying how many were cut included). Applying it again
    changes nothing."""
    if type(text) is not str:  # a subclass the log cannot encode, or not a str at all
        text = str.__str__(text) if isinstance(text, str) else repr(text)
    if text.isascii() and "\x00" not in text:
        fixed = text
    else:
        fixed = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    if len(fixed) > MAX_ERROR_CHARS:
        # The whole stays within the limit, so a text made storable once is left as it is.
        keep = MAX_ERROR_CHARS - 40
        fixed = f"{fixed[:keep]}... ({len(fixed) - keep} more characters cut)"
    return fixed


def check_json(value: Any, *, what: str) -> None:
    """Raise :class:`InvalidJob` unless ``value`` is a JSON value trioq keeps as it is.

    That is: dicts with string keys, lists (tuples become lists), strings,
    ints, finite floats, bools and ``None``, nested at most
    :data:`MAX_DEPTH` levels. (Ints beyond 64 bits and strings with lone surrogates are JSON,
    but no store holds them: the store refuses them as it encodes them.)
    A dict key that is not a string is refused, though ``json.dumps`` would
    turn it into one: the job would then differ between the Python API and
    HTTP. A flat dict of strings, 64-bit ints, bools, ``None`` and finite
    floats under string keys (the common payload) is checked without
    walking it.
    """
    if type(value) is dict:
        for k, v in value.items():
            t = type(v)
            if type(k) is not str:
                break
            if t in _PLAIN:
                if t is int and not INT_MIN <= v <= INT_MAX:
                    break
            elif t is not float or not math.isfinite(v):
                break
        else:
            return
    try:
        _walk_json(value, 1)
    except _NotJson as exc:
        where = what + "".join(reversed(exc.path))
        raise InvalidJob(f"{what} must be a JSON value: {where} {exc.problem}", field=what) from None


class _NotJson(Exception):
    """What :func:`_walk_json` found; ``path`` collects the way to it, innermost first."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []


def _walk_json(value: Any, depth: int) -> None:
    """Raise :class:`_NotJson` at the first part of ``value`` (a container at ``depth``) that is
    not a JSON value trioq keeps."""
    t = type(value)
    if t is str or t is bool or value is None:
        return
    if isinstance(value, int):
        return  # beyond 64 bits: the store refuses it as it encodes it
    if isinstance(value, float):
        if math.isfinite(value):
            return
        raise _NotJson(f"is {value}, which JSON cannot hold")
    if isinstance(value, str):
        return
    if isinstance(value, dict | list | tuple) and depth > MAX_DEPTH:
        raise _NotJson(f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        # dict.items and list.__iter__, not the value's own: a subclass that
        # overrides them must show what the encoder reads, its storage.
        for k, v in dict.items(value):
            if not isinstance(k, str):
                raise _NotJson(f"has the key {k!r:.60}, a {type(k).__name__}; keys must be strings")
            try:
                _walk_json(v, depth + 1)
            except _NotJson as exc:
                exc.path.append(f"[{k!r:.60}]")
                raise
        return
    if isinstance(value, list | tuple):
        for i, v in enumerate(list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)):
            try:
                _walk_json(v, depth + 1)
            except _NotJson as exc:
                exc.path.append(f"[{i}]")
                raise
        return
    raise _NotJson(f"is a {type(value).__name__}, not a JSON value")


def error_text(exc: BaseException, message: str | None = None) -> str:
    """The ``"Type: message"`` form stored in :attr:`Job.error`, always storable (:func:`storable_text`).

    ``message`` replaces the exception's own. An exception whose ``str()``
    raises is described by its type alone.
    """
    name = type(exc).__qualname__
    if message is None:
        try:
            message = str(exc)
        except Exception as failure:
            message = f"<str() of the error raised {type(failure).__qualname__}>"
    return storable_text(f"{name}: {message}" if message else name)
