"""The records of the write-ahead log, one typed struct per record type (log format 6).

A record's payload (see :mod:`._format` for the framing) is a msgpack array of
its struct's fields, in the order declared here: every struct is
``array_like``. Recovery decodes each payload through the struct of its
frame's type byte (as :func:`decode_record` does), so a record that does not
fit it (a missing field, a field of the wrong type) is damage, reported where
it is.

Evolving the format: fields are only ever appended, and every field added
after the first release of a record type has a default. A shorter array
decodes with the missing trailing fields at their defaults, so a log written
before a field existed still reads (format-2 and format-3 records are such
shorter arrays: neither needs anything else); a longer one (a later trioq's
field) decodes with the extra trailing elements ignored. Writers leave
trailing fields they do not use off (the table store's tuples hold only the
fields it knows, and only up to the last one off its default;
:func:`record_fields` trims a struct's trailing defaults, which ``msgspec``
does not do for ``array_like`` structs, jcrist/msgspec#720), so a field at
its default costs the log nothing: an ADD of the default queue, with no
tenant and no deadline, is the 8 fields of format 2.

Who writes what: the table store hands each transition's record to
``TableStore._record`` as a tuple in its struct's field order, and the writer
encodes it as it is. That is the hot path (ADD, the commonest record, and a
worker's CLAIM and SUCCEED): a tuple costs a third of a struct to build, and
a struct would be encoded with its defaults too (13 bytes more per ADD).
``tests/stores/test_wal_format.py`` checks every record the store writes
against its struct. The log writer writes the checkpoint: ENTRY rows are
``JobTable.export()``'s tuples, BEGIN and END structs (:func:`._format.frame_record`).

Log format 6 (``VERSION = 6`` in the segment header) records, by type byte
(``?`` marks a trailing field with a default, ``| None`` one that may be nil)::

    1   ADD      Add        id, task, payload (msgpack, embedded raw), priority, key | None,
                            max_attempts, run_at, now; ? queue = "default", ? tenant = None,
                            ? limits = [] (its limit keys), ? after = [] (its parents'
                            ids, format 6), ? deadline = None (the wall-clock time by which
                            the job must start, else it expires), ? metadata = None (nothing
                            writes it yet), ? deferred = False (it was enqueued past the
                            admission bound: written, with every field before it, only when
                            true)
    2   CLAIM    Claim      id; ? now = None (the claim's time, for a job holding limit keys)
    3   SUCCEED  Succeed    id, epoch, result, now
    4   FAIL     Fail       id, epoch, error, retry_at | None (None: no retry, dead now), now,
                            ? traceback = None
    5   RELEASE  Release    id, epoch
    6   CANCEL   Cancel     id, now
    7   RETRY    Retry      id, now
    8   DROP     Drop       id
    9   ENTRY    Row        one job of a checkpoint: id, task, payload (a map), state (its
                            string value), priority, key | None, max_attempts, run_at,
                            created_at, seq, attempts, epoch, finished_at | None, result (a
                            non-scalar one as msgpack bin), error | None; ? errors = []
                            ([attempt, error, traceback | None, finished_at] each),
                            ? snoozes = 0; ? queue, ? tenant, ? limits, ? after, ? deadline,
                            ? metadata as on ADD (the deadline stays with the job once it
                            started, and goes at a retry), ? cancelled_by = None (format 6:
                            the parent whose end cancelled it)
    10  CHECKPOINT_BEGIN  CheckpointBegin  jobs (the ENTRY records that follow);
                            ? paused = [] (the paused queues' names, sorted),
                            ? rates = [] ([key, tat] of each rate's GCRA, sorted),
                            ? ticks = [] ([name, tick] of each cron schedule's last tick,
                            sorted; format 6)
    11  CHECKPOINT_END    CheckpointEnd    jobs
    12  SNOOZE   Snooze     id, epoch, run_at, now
    13  EXPIRE   Expire     id, now: a never-claimed job cancelled at ``now`` for its deadline
    14  PAUSE    Pause      queue: claims stopped taking the queue's jobs
    15  RESUME   Resume     queue: claims take them again
    16  ADMIT    Admit      id, now: a deferred job admitted at ``now`` (ready, or scheduled
                            if its run_at is later)
    17  TICK     Tick       name, tick: cron schedule ``name``'s last tick is now ``tick`` (wall
                            clock; format 6); the batch holding it holds the tick's ADD too,
                            right after it (none for a baseline, or a tick whose key was held)

The paused queues and the rates' tokens are a table's state like its jobs,
so a checkpoint carries them, on its BEGIN: replay sets them up right where
it clears the table (BEGIN is where the table is rebuilt from), before any
ENTRY, and END stays a plain count. A checkpoint is one committed batch, so
which of the two holds them makes no difference to what a crash can leave.
(A key's slots need no record: its holders are the running jobs, which the
ENTRY rows and CLAIM records rebuild.) The cron schedules' last ticks are the
store's state (``table/cron.py``), not the table's; a checkpoint carries them
on its BEGIN all the same, and replay keeps them in ``Recovery.ticks``.

Format 5 has no ``after`` on ADD and ENTRY in use (declared, never written)
and no ENTRY ``cancelled_by``: its jobs have no parents. A format-5 trioq would
read a format-6 ADD's parents as nothing, so the version moved.

Format 4 has no ADD ``deferred`` and no ADMIT (a format-4 trioq would call both
damage: the version moved so that it refuses the directory instead).

Format 3 has none of ADD's and ENTRY's trailing fields after ``snoozes`` in
use (they were declared, never written), no CLAIM time, no paused queues or
rates on BEGIN, and no EXPIRE, PAUSE or RESUME (a pre-release tree that wrote
some of them under a version-3 header reads the same). Format 2 also leaves
fields off: its FAIL has no traceback (5 fields, ``retry_at`` never nil), its
ENTRY neither errors nor snoozes (15 fields), and it has no SNOOZE (trioq
before format 3 may also have written the longer FAIL and ENTRY and SNOOZE
under a version-2 header; they read the same). Both read through these structs as they are: their jobs come
back in the default queue, with no tenant, no deadline and no limit key, and no
queue paused. Nothing writes ``metadata`` yet, and replay ignores it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import msgspec

from ..table.cron import TICK
from ..table.store import (
    ADD,
    ADMIT,
    CANCEL,
    CLAIM,
    DROP,
    EXPIRE,
    FAIL,
    PAUSE,
    RELEASE,
    RESUME,
    RETRY,
    SNOOZE,
    SUCCEED,
)

__all__ = [
    "CHECKPOINT_BEGIN",
    "CHECKPOINT_END",
    "ENTRY",
    "RECORDS",
    "Add",
    "Admit",
    "Cancel",
    "CheckpointBegin",
    "CheckpointEnd",
    "Claim",
    "Drop",
    "Expire",
    "Fail",
    "Pause",
    "Record",
    "Release",
    "Resume",
    "Retry",
    "Row",
    "Snooze",
    "Succeed",
    "Tick",
    "decode_record",
    "record_fields",
]

# The table's transitions are types 1 to 8 and 12 to 15 (trioq/stores/table/store.py);
# a checkpoint is BEGIN (the table is rebuilt from here), one ENTRY per job, END.
ENTRY, CHECKPOINT_BEGIN, CHECKPOINT_END = 9, 10, 11


class Record(msgspec.Struct, array_like=True, gc=False, frozen=True):
    """A log record: its fields are its payload's msgpack array, in order.

    Untracked by the cyclic GC (``gc=False``): a decoded record holds only
    what msgpack decoded, which cannot refer back to it.
    """

    #: The record's type byte in its frame.
    kind: ClassVar[int]


class Add(Record, array_like=True, gc=False, frozen=True):
    """ADD: a job was enqueued (``JobTable.add_packed``'s arguments).

    ``payload`` is the msgpack the table keeps, embedded as it is (never
    decoded on replay). ``queue`` names the job's queue, ``tenant`` whom it
    runs for, ``limits`` its limit keys, ``deadline`` the absolute wall-clock
    time (seconds, as ``now``) by which it must have started, else it expires
    (EXPIRE); ``None``: never. Written from format 4, and left off while at
    their defaults. ``after`` (format 6): the ids of its parents; replay works
    out from them, as the live add did, whether it starts waiting or
    cancelled. ``metadata`` is for what is coming: no trioq writes it yet, and
    replay ignores it.
    """

    kind: ClassVar[int] = ADD
    id: str
    task: str
    payload: msgspec.Raw
    priority: int
    key: str | None
    max_attempts: int
    run_at: float
    now: float
    queue: str = "default"
    tenant: str | None = None
    limits: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    deadline: float | None = None
    metadata: dict[str, Any] | None = None
    deferred: bool = False


class Claim(Record, array_like=True, gc=False, frozen=True):
    """CLAIM: the job went ``running`` under its next epoch.

    ``now``: the claim's time, written (format 4) for a job holding limit
    keys only, so replay takes its rate tokens again (``JobTable.claim``);
    ``None`` for any other job, and in older logs.
    """

    kind: ClassVar[int] = CLAIM
    id: str
    now: float | None = None


class Succeed(Record, array_like=True, gc=False, frozen=True):
    """SUCCEED: the attempt under ``epoch`` returned ``result`` (a non-scalar one embedded as packed)."""

    kind: ClassVar[int] = SUCCEED
    id: str
    epoch: int
    result: Any
    now: float


class Fail(Record, array_like=True, gc=False, frozen=True):
    """FAIL: the attempt under ``epoch`` failed; retry at ``retry_at`` (``None``: no retry, dead now).

    Format 2 has no ``traceback`` (and never a nil ``retry_at``).
    """

    kind: ClassVar[int] = FAIL
    id: str
    epoch: int
    error: str
    retry_at: float | None
    now: float
    traceback: str | None = None


class Release(Record, array_like=True, gc=False, frozen=True):
    """RELEASE: the attempt under ``epoch`` was cut off; the job is ``ready`` again, uncounted."""

    kind: ClassVar[int] = RELEASE
    id: str
    epoch: int


class Cancel(Record, array_like=True, gc=False, frozen=True):
    """CANCEL: the job was cancelled at ``now``."""

    kind: ClassVar[int] = CANCEL
    id: str
    now: float


class Retry(Record, array_like=True, gc=False, frozen=True):
    """RETRY: the dead or cancelled job was sent back to ``ready`` at ``now``."""

    kind: ClassVar[int] = RETRY
    id: str
    now: float


class Drop(Record, array_like=True, gc=False, frozen=True):
    """DROP: the terminal job was evicted."""

    kind: ClassVar[int] = DROP
    id: str


class Snooze(Record, array_like=True, gc=False, frozen=True):
    """SNOOZE: the attempt under ``epoch`` snoozed until ``run_at``, uncounted (format 3)."""

    kind: ClassVar[int] = SNOOZE
    id: str
    epoch: int
    run_at: float
    now: float


class Expire(Record, array_like=True, gc=False, frozen=True):
    """EXPIRE: the never-claimed job passed its deadline and was cancelled at ``now``, its error saying so (format 4).

    A sweep (``JobTable.expire_due``, from a claim or a promote) makes these;
    replay applies them through ``JobTable.expire``, which sets the same
    error text from the job's ``created_at`` and deadline.
    """

    kind: ClassVar[int] = EXPIRE
    id: str
    now: float


class Admit(Record, array_like=True, gc=False, frozen=True):
    """ADMIT: the deferred job was admitted at ``now`` (format 5).

    The table's admissions (``JobTable.admit_due``, from a claim, a cancel, an
    expiry or a session's open) make these; replay applies them through
    ``JobTable.admit`` (replay itself never admits: the bound may differ now).
    """

    kind: ClassVar[int] = ADMIT
    id: str
    now: float


class Pause(Record, array_like=True, gc=False, frozen=True):
    """PAUSE: claims stopped taking the jobs of ``queue`` (they stay ready) (format 4)."""

    kind: ClassVar[int] = PAUSE
    queue: str


class Resume(Record, array_like=True, gc=False, frozen=True):
    """RESUME: claims take the jobs of the paused ``queue`` again (format 4)."""

    kind: ClassVar[int] = RESUME
    queue: str


class Row(Record, array_like=True, gc=False, frozen=True):
    """ENTRY: one job of a checkpoint, as ``JobTable.export()`` makes and ``JobTable.restore`` takes it.

    ``errors`` and ``snoozes`` are new in format 3. The fields after them are
    ADD's trailing ones, for a job's whole life: ``queue``, ``tenant``,
    ``limits`` and ``deadline`` (an absolute wall-clock time) are written from
    format 4, left off while at their defaults; ``after`` (its parents' ids)
    from format 6; ``metadata`` is not written yet, and replay ignores it.
    ``cancelled_by`` (format 6): the parent whose death or cancel cancelled the
    job (a retry of that parent makes it wait again).
    """

    kind: ClassVar[int] = ENTRY
    id: str
    task: str
    payload: dict[str, Any]
    state: str
    priority: int
    key: str | None
    max_attempts: int
    run_at: float
    created_at: float
    seq: int
    attempts: int
    epoch: int
    finished_at: float | None
    result: Any
    error: str | None
    errors: tuple[tuple[int, str, str | None, float], ...] = ()
    snoozes: int = 0
    queue: str = "default"
    tenant: str | None = None
    limits: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    deadline: float | None = None
    metadata: dict[str, Any] | None = None
    cancelled_by: str | None = None


class CheckpointBegin(Record, array_like=True, gc=False, frozen=True):
    """CHECKPOINT_BEGIN: the table is rebuilt from here, from the ``jobs`` ENTRY records that follow.

    ``paused``: the queues paused at the checkpoint, sorted. ``rates``:
    ``(key, tat)`` of each limit key whose rate has taken tokens, sorted
    (its GCRA's theoretical arrival time, wall clock: the tokens the claims
    before the checkpoint took, which its ENTRY rows do not say). Both format
    4; a format-3 checkpoint has neither, and there was neither then.
    ``ticks``: ``(name, tick)`` of each cron schedule's last tick, sorted
    (format 6; none before).
    """

    kind: ClassVar[int] = CHECKPOINT_BEGIN
    jobs: int
    paused: tuple[str, ...] = ()
    rates: tuple[tuple[str, float], ...] = ()
    ticks: tuple[tuple[str, float], ...] = ()


class Tick(Record, array_like=True, gc=False, frozen=True):
    """TICK: cron schedule ``name`` took its tick at wall time ``tick`` (or, with no ADD after it,
    recorded a baseline) (format 6). Replay sets ``Recovery.ticks[name]`` (see ``table/cron.py``)."""

    kind: ClassVar[int] = TICK
    name: str
    tick: float


class CheckpointEnd(Record, array_like=True, gc=False, frozen=True):
    """CHECKPOINT_END: the checkpoint's ``jobs`` ENTRY records are over."""

    kind: ClassVar[int] = CHECKPOINT_END
    jobs: int


_STRUCTS: tuple[type[Record], ...] = (
    Add, Claim, Succeed, Fail, Release, Cancel, Retry, Drop, Row, CheckpointBegin, CheckpointEnd, Snooze,
    Expire, Pause, Resume, Admit, Tick,
)  # fmt: skip
#: Every record struct by its type byte.
RECORDS: dict[int, type[Record]] = {cls.kind: cls for cls in _STRUCTS}

_DECODERS: dict[int, Callable[[bytes | memoryview], Record]] = {
    kind: msgspec.msgpack.Decoder(cls).decode for kind, cls in RECORDS.items()
}


def decode_record(kind: int, payload: bytes | memoryview) -> Record:
    """The record of type ``kind`` that ``payload`` holds.

    Raises ``KeyError`` for a type that is no record's, and
    ``msgspec.ValidationError`` (or ``DecodeError``) for a payload that does
    not fit the type's struct.
    """
    return _DECODERS[kind](payload)


#: Per struct: each field's default, or ``_REQUIRED``.
_REQUIRED = object()
_DEFAULTS: dict[type[Record], tuple[Any, ...]] = {
    cls: tuple(_REQUIRED if f.default is msgspec.NODEFAULT else f.default for f in msgspec.structs.fields(cls))
    for cls in RECORDS.values()
}


def record_fields(record: Record) -> tuple[Any, ...]:
    """``record``'s fields as the log writes them: in order, trailing fields at their defaults left off.

    A default counts only as itself, of its own type (``0.0`` is not the
    default ``0``), so what is written always decodes back equal.
    """
    values = msgspec.structs.astuple(record)
    defaults = _DEFAULTS[type(record)]
    end = len(values)
    while end:
        value, default = values[end - 1], defaults[end - 1]
        if default is _REQUIRED or type(value) is not type(default) or value != default:
            break
        end -= 1
    return values[:end]
