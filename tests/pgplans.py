"""What the PostgreSQL tests of the store's SQL share: a hand-moved clock, a connection that only records,
and the plan of the claim statement a call sends.

Each test module keeps its own schema prefix and node helper (their configs differ).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

#: The fake clock's start: wall-clock seconds in November 2023.
START = 1_700_000_000.0


class Clock:
    """The wall clock of every session of a test: moved by hand."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Recording:
    """A stand-in connection: records each statement a transition sends; answers ``rows`` (none unless
    given) where all rows are asked for, ``one`` where one row is."""

    def __init__(self, one: tuple[Any, ...] | None = None, rows: list[tuple[Any, ...]] | None = None) -> None:
        self.sent: list[tuple[str, Any]] = []
        #: Whether each statement sent asked to be prepared.
        self.prepared: list[bool] = []
        self.one = one
        self.rows = rows or []

    def cursor(self, **kwargs: Any) -> Recording:
        return self

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, query: str, params: Any = None, prepare: bool | None = None) -> None:
        self.sent.append((query, params))
        self.prepared.append(bool(prepare))

    def fetchall(self) -> list[Any]:
        return list(self.rows)

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.one


def claim_plan(conn: psycopg.Connection[Any], claim: Callable[[Recording], object]) -> dict[str, Any]:
    """The plan (EXPLAIN ANALYZE, BUFFERS, in a transaction rolled back) of the claim statement that
    ``claim(connection)`` sends."""
    recording = Recording()
    claim(recording)
    (query, params), *_ = [sent for sent in recording.sent if "FOR UPDATE SKIP LOCKED" in sent[0]]
    with conn.transaction(force_rollback=True):
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params, prepare=False).fetchone()
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return dict(plan[0]["Plan"])


def jobs_scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every scan of the jobs table in the plan under ``node``."""
    if node.get("Relation Name") == "jobs":
        yield node
    for child in node.get("Plans", ()):
        yield from jobs_scans(child)
