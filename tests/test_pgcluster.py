"""The session's throwaway PostgreSQL cluster (``pg_cluster``, ``pg_dsn``) works."""

from __future__ import annotations

import psycopg
import pytest

from .pgcluster import Cluster, ExternalCluster


def _current_database(dsn: str) -> str:
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        row = conn.execute("select current_database()").fetchone()
    assert row is not None
    name: str = row[0]
    return name


def test_pg_dsn_connects(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, connect_timeout=10) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_each_test_gets_its_own_database(pg_cluster: Cluster | ExternalCluster, pg_dsn: str) -> None:
    other = pg_cluster.create_database("t_other_for_this_test")
    assert _current_database(pg_dsn) != _current_database(other)
    assert _current_database(pg_dsn).startswith("t_")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_databases_survive_a_restart(pg_cluster: Cluster | ExternalCluster, pg_dsn: str, mode: str) -> None:
    if not pg_cluster.can_restart:
        pytest.skip("TRIOQ_PG_DSN names an external server, which the tests cannot restart")
    other = pg_cluster.create_database(f"t_restart_{mode}")
    with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute("create table kept (n int)")
        conn.execute("insert into kept values (42)")
    pg_cluster.restart(mode)
    with psycopg.connect(pg_dsn, connect_timeout=10) as conn:
        assert conn.execute("select n from kept").fetchone() == (42,)
    assert _current_database(pg_dsn) != _current_database(other)
