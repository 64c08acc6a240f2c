"""A PostgreSQL transition tried again after its first try committed unseen (the connection broke
before the reply) answers as the first try would have, instead of refusing what it did itself.

The first try runs as usual; the second, with ``retried=True``, sees the committed result, which is
what PostgresStore's retry loop hands it after a broken connection.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from trioq import JobState
from trioq.stores import Failed, NewJob, Succeeded
from trioq.stores.postgres import _transitions as sql
from trioq.stores.postgres._schema import migrate

pytestmark = pytest.mark.slow

NOW = 1_700_000_000.0
S = "trioq"


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        migrate(c, S)
        yield c


def _rows(*ids: str, key: str | None = None) -> list[tuple[str, NewJob, str]]:
    return [(job_id, NewJob("t", {}, 0, key, 2, 0.0), "{}") for job_id in ids]


def test_add_with_a_bound_is_not_refused_by_its_own_first_try(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    rows = _rows("a", "b")
    assert sql.add(conn, S, rows, NOW, 2, None) == [None, None]
    assert sql.add(conn, S, rows, NOW, 2, None, retried=True) == [None, None]  # not QueueFull
    keyed = _rows("c", key="k")
    assert sql.add(conn, S, keyed, NOW, None, None) == [None]
    assert sql.add(conn, S, keyed, NOW, None, None, retried=True) == [None]
    assert sql.counts(conn, S)["ready"] == 3


def test_complete_cancel_and_retry_recognise_their_first_try(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    sql.add(conn, S, _rows("a", "b", "c"), NOW, None, None)
    claimed = {job.id: job for job in sql.claim(conn, S, "n", 3, NOW + 30, "1", False)}
    outcomes = [Succeeded("a", claimed["a"].epoch, 1), Failed("b", claimed["b"].epoch, "E: x", 5.0)]
    first = sql.complete(conn, S, outcomes, NOW + 1, "ch", "n")
    assert first[0] == [JobState.SUCCEEDED, JobState.SCHEDULED]
    again = sql.complete(conn, S, outcomes, NOW + 1, "ch", "n", retried=True)
    assert again[0] == first[0]
    # A stale outcome is still refused on a retried call, and so is a later call's.
    assert sql.complete(conn, S, outcomes, NOW + 2, "ch", "n", retried=True)[0] == [None, None]

    result, running = sql.cancel(conn, S, "c", NOW + 3, "ch", "n")
    assert (result.changed, running) == (True, claimed["c"].epoch)
    result, running = sql.cancel(conn, S, "c", NOW + 3, "ch", "n", retried=True)
    assert (result.changed, running) == (True, claimed["c"].epoch)
    assert sql.cancel(conn, S, "c", NOW + 4, "ch", "n", retried=True)[0].changed is False

    assert sql.retry(conn, S, "c", NOW + 5, ("ch", "r|n|1")).state is JobState.READY
    assert sql.retry(conn, S, "c", NOW + 5, ("ch", "r|n|1"), retried=True).state is JobState.READY
    with pytest.raises(Exception, match="only dead or cancelled"):
        sql.retry(conn, S, "c", NOW + 6, ("ch", "r|n|1"), retried=True)


def test_a_batch_past_max_batch_is_applied_in_order_in_bounded_statements(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    """1,200 outcomes in one call go in statements of at most ``MAX_BATCH``: all applied, finish order kept."""
    ids = [f"j{i:05d}" for i in range(1200)]
    sql.add(conn, S, _rows(*ids), NOW, None, None)
    claimed = {job.id: job for job in sql.claim(conn, S, "n", 1200, NOW + 30, "1", False)}
    order = list(reversed(ids))  # not id order: the finish order must follow the outcomes
    outcomes = [Succeeded(job_id, claimed[job_id].epoch, None) for job_id in order]
    states, finished, _ = sql.complete(conn, S, outcomes, NOW + 1, "ch", "n")
    assert states == [JobState.SUCCEEDED] * 1200
    assert finished == order
    rows = conn.execute(f"SELECT id FROM {S}.jobs ORDER BY finish_seq").fetchall()
    assert [row[0] for row in rows] == order
    assert sql.MAX_BATCH < 1200
