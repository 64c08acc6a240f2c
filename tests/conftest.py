"""Shared helpers for trioq's tests."""

from __future__ import annotations

import importlib.util
import itertools
import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
import trio
import trio.lowlevel

from .pgcluster import Cluster, ExternalCluster, no_postgres, start_cluster

pytest_plugins = ["pytester"]


class TaskTracker(trio.abc.Instrument):
    """A trio instrument that knows which tasks spawned since it was added are alive."""

    def __init__(self) -> None:
        self.alive: set[trio.lowlevel.Task] = set()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.alive.add(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.alive.discard(task)


@pytest.fixture
async def task_tracker() -> AsyncIterator[TaskTracker]:
    tracker = TaskTracker()
    trio.lowlevel.add_instrument(tracker)
    try:
        yield tracker
    finally:
        trio.lowlevel.remove_instrument(tracker)


_database_numbers = itertools.count()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster | ExternalCluster]:
    """One PostgreSQL server for the session: a throwaway local cluster, or ``TRIOQ_PG_DSN``'s."""
    if importlib.util.find_spec("psycopg") is None:
        no_postgres("psycopg is not installed (pip install 'psycopg[binary]')")
    cluster = start_cluster(in_memory=True)
    if cluster is None:
        no_postgres("no PostgreSQL binaries found (apt-get install postgresql), and TRIOQ_PG_DSN is not set")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_dsn(pg_cluster: Cluster | ExternalCluster) -> str:
    """A DSN to a fresh, empty database of its own (not dropped: the cluster is thrown away)."""
    return pg_cluster.create_database(f"t_{next(_database_numbers)}_{secrets.token_hex(4)}")
