"""Rows of the jobs table as :class:`~trioq.Job` snapshots, and values as the table stores them.

Payloads, results and ``errors`` live in ``json`` columns (the text as
written, so every float and key order comes back as it went in; ``jsonb``
would rewrite ``1e300`` as a 301-digit integer). They are selected as text
and decoded here with msgspec, independent of the adapters of whichever
connection read them (``enqueue_tx`` uses the caller's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ..._model import FailedAttempt, InvalidJob, Job, JobState
from ..table.jobs import pack_payload, stored_result

__all__ = ["COLUMNS", "WIDTH", "encode_payload", "encode_result", "job_from_row", "loads"]

#: The select list every snapshot is read with, in :func:`job_from_row`'s order.
COLUMNS = (
    "id, task, payload::text, state, attempts, epoch, priority, key, max_attempts, run_at, created_at,"
    " finished_at, result::text, error, errors::text, queue, tenant, deadline, limits, parents"
)
#: How many columns :data:`COLUMNS` selects: a statement that selects more after them finds them from here on.
WIDTH = 20

_STATES = {state.value: state for state in JobState}
#: The longest JSON text a column takes: PostgreSQL's 1 GB field limit, less room for the row.
MAX_JSON_BYTES = (1 << 30) - (1 << 20)
loads = msgspec.json.Decoder().decode
_dumps = msgspec.json.Encoder().encode


def job_from_row(row: Sequence[Any]) -> Job:
    """A snapshot of one row selected with :data:`COLUMNS`."""
    errors = row[14]
    return Job(
        row[0],
        row[1],
        loads(row[2]),
        _STATES[row[3]],
        row[4],
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        row[11],
        None if row[12] is None else loads(row[12]),
        row[13],
        tuple(FailedAttempt(*e) for e in loads(errors)) if errors is not None else (),
        row[15],
        row[16],
        row[17],
        tuple(row[18]) if row[18] else (),
        tuple(row[19]) if row[19] else (),
    )


def encode_payload(payload: dict[str, Any], field: str) -> str:
    """``payload`` as the JSON text its column keeps, after every check the other stores make.

    Raises :class:`~trioq.InvalidJob` naming ``field`` for what a store cannot
    hold (see :func:`~trioq.stores.table.jobs.pack_payload`).
    """
    if type(payload) is dict and not payload:
        return "{}"
    pack_payload(payload, field=field)  # the checks (JSON, 64-bit ints, surrogates, size) of every store
    return _fits(_dumps(payload), field)


def encode_result(result: Any) -> str | None:
    """A success's result as JSON text (``None`` for ``None``); :class:`~trioq.InvalidJob` if unstorable."""
    if result is None:
        return None
    stored_result(result)  # the checks of every store
    return _fits(_dumps(result), "result")


def _fits(text: bytes, field: str) -> str:
    """``text`` decoded, or :class:`~trioq.InvalidJob`: JSON escapes control characters six bytes each, so
    a value within every store's msgpack limit can still pass PostgreSQL's field limit."""
    if len(text) > MAX_JSON_BYTES:
        raise InvalidJob(
            f"{field} cannot be stored: it is {len(text)} bytes as JSON, and PostgreSQL holds at most "
            f"{MAX_JSON_BYTES}; keep large data elsewhere and pass a reference to it",
            field=field,
        )
    return text.decode()


def encode_limits(limits: Sequence[str]) -> str | None:
    """A job's limit keys as a ``text[]`` literal (``None`` for none): arrays of arrays of differing
    lengths cannot travel as one parameter, a column of literals can."""
    if not limits:
        return None
    return "{" + ",".join('"' + k.replace("\\", "\\\\").replace('"', '\\"') + '"' for k in limits) + "}"


def encode_errors(errors: Sequence[tuple[int, str, str | None, float]]) -> str:
    """A job's failed attempts as the JSON text of its ``errors`` column."""
    return _dumps(errors).decode()
