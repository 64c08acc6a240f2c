"""PostgresStore's listings on a large table: each page is read from the ``jobs_listing`` index, not a scan.

The behaviour of ``list_jobs`` is the conformance suite's (``_cases_admin``); this checks the plans of its
statement at 50,000 jobs (most of them succeeded, as a retained table is), which the planner only chooses
well when the LIMIT is written into the statement and each state is its own ordered branch.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from trioq import JobState
from trioq.stores import JobFilter
from trioq.stores.postgres._listing import list_jobs
from trioq.stores.postgres._schema import migrate

from .pgcluster import Cluster, ExternalCluster
from .pgplans import START, Recording, jobs_scans

pytestmark = pytest.mark.slow

TOTAL = 50_000


@pytest.fixture(scope="module")
def table(pg_cluster: Cluster | ExternalCluster) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    """50,000 jobs in one schema, analysed: every 100th dead, every 7th of task "rare", the rest succeeded.
    Built once for the module: the tests only read it."""
    schema = f"l_{secrets.token_hex(4)}"
    dsn = pg_cluster.create_database(f"t_listing_{secrets.token_hex(4)}")
    with psycopg.connect(dsn, autocommit=True, options="-c enable_bitmapscan=off") as conn:
        migrate(conn, schema)
        conn.execute(
            f"INSERT INTO {schema}.jobs (id, task, payload, state, priority, max_attempts, run_at, created_at)"
            " SELECT 'j-' || lpad(g::text, 8, '0'), CASE WHEN g %% 7 = 0 THEN 'rare' ELSE 't' END, '{}',"
            " CASE WHEN g %% 100 = 0 THEN 'dead' ELSE 'succeeded' END, 0, 3, %s, %s FROM generate_series(1, %s) g",
            (START, START, TOTAL),
        )
        conn.execute(f"ANALYZE {schema}.jobs")
        yield conn, schema


def _plan(conn: psycopg.Connection[Any], schema: str, where: JobFilter, limit: int, after: int | None) -> Any:
    """The plan (EXPLAIN ANALYZE, BUFFERS) of the page statement ``list_jobs`` sends."""
    recording = Recording(one=None if after is None else (after,))
    list_jobs(recording, schema, where, limit, None if after is None else "cursor")
    query, params = recording.sent[-1]
    row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params, prepare=False).fetchone()
    assert row is not None
    plan = row[0] if not isinstance(row[0], str) else json.loads(row[0])
    return plan[0]["Plan"]


@pytest.mark.parametrize(
    "where",
    [JobFilter(states=(JobState.DEAD,)), JobFilter(), JobFilter(states=(JobState.SUCCEEDED,), task="rare")],
    ids=["dead", "every-state", "task"],
)
@pytest.mark.parametrize("after", [None, TOTAL // 2], ids=["first-page", "middle-page"])
def test_a_page_reads_the_listing_index_backwards_not_the_table(
    table: tuple[psycopg.Connection[Any], str], where: JobFilter, after: int | None
) -> None:
    conn, schema = table
    plan = _plan(conn, schema, where, 50, after)
    scans = list(jobs_scans(plan))
    assert scans and all(scan["Node Type"] == "Index Scan" for scan in scans), scans
    # jobs_waiting and jobs_deferred are (seq) for their state alone: as good for that branch.
    assert {scan["Index Name"] for scan in scans} <= {"jobs_listing", "jobs_waiting", "jobs_deferred"}
    assert all(scan["Scan Direction"] == "Backward" for scan in scans)
    assert plan["Actual Rows"] == 50
    # A page touches a few hundred buffers at most, however large the table (a scan reads thousands).
    assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) < 800, plan["Shared Hit Blocks"]
