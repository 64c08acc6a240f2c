"""One ``trioq serve --postgres`` and ``trioq worker`` processes sharing a queue: kills, SIGTERM, a
database restart, cancels across processes, leader failover.

Every handler journals its attempts to files the store never sees (``pg_app``), so the checks of
what ran, how often and when do not trust the store. Leases are 2 s so that rescue is quick.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from .pg_app import read_journal
from .pgcluster import Cluster, ExternalCluster
from .processes import read_until

pytestmark = pytest.mark.slow

LEASE = 2.0
_BANNER = re.compile(r"(trioq serving on (http://127\.0\.0\.1:\d+)|trioq worker (\S+):).*\n")


class Node:
    """A ``trioq serve``/``trioq worker`` child on the test's database; its stderr goes to a file."""

    def __init__(self, kind: str, dsn: str, journal: Path, *extra: str) -> None:
        self.log = journal.parent / f"{kind}-{time.monotonic_ns()}.stderr"
        self._stderr = self.log.open("ab")
        command = [sys.executable, "-m", "trioq", kind, "--postgres", dsn, "--lease", str(LEASE), *extra]
        command += ["--app", "tests.pg_app:registry"]
        if kind == "serve":
            command += ["--host", "127.0.0.1", "--port", "0", "--workers", "0"]
        else:
            command += ["--workers", "4", "--shutdown-grace", "3"]
        env = dict(os.environ, PYTHONUNBUFFERED="1", TRIOQ_TEST_JOURNAL=str(journal))
        env.pop("TRIOQ_TOKEN", None)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        self.url = ""
        self.node = ""
        self._wait_for_banner(timeout=20)

    def _wait_for_banner(self, timeout: float) -> None:
        match, buffer = read_until(self.process, _BANNER, timeout)
        if match is not None:
            self.url = match.group(2) or ""
            self.node = match.group(3) or ""
            return
        self.kill()
        pytest.fail(f"node did not start; stdout {buffer!r}; stderr {self.log.read_text(errors='replace')!r}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    directory = tmp_path / "journal"
    directory.mkdir()
    return directory


@pytest.fixture
def start(pg_dsn: str, journal: Path) -> Iterator[Callable[..., Node]]:
    """Start nodes on the test's database; every one is killed at the end."""
    nodes: list[Node] = []

    def starter(kind: str, *extra: str) -> Node:
        node = Node(kind, pg_dsn, journal, *extra)
        nodes.append(node)
        return node

    try:
        yield starter
    finally:
        for node in nodes:
            node.kill()


def _until(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout}s")
        time.sleep(0.02)


def _enqueue(url: str, count: int, seconds: float, task: str = "step") -> list[str]:
    jobs = [{"task": task, "payload": {"seconds": seconds, "n": i}} for i in range(count)]
    response = httpx.post(f"{url}/jobs/batch", json={"jobs": jobs}, timeout=10)
    assert response.status_code == 202, response.text
    return [job["id"] for job in response.json()["jobs"]]


def _states(dsn: str, ids: list[str]) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, state FROM trioq.jobs WHERE id = ANY(%s)", (ids,)).fetchall()
    return dict(rows)


def _all_succeeded(dsn: str, ids: list[str]) -> bool:
    states = _states(dsn, ids)
    return len(states) == len(ids) and set(states.values()) == {"succeeded"}


def _running_on(journal: Path, pid: int) -> set[str]:
    """The jobs process ``pid`` has journaled a start of and no end (running, or cut off)."""
    lines = read_journal(journal)
    started = {line["job"] for line in lines if line["pid"] == pid and line["event"] == "start"}
    return started - {line["job"] for line in lines if line["pid"] == pid and line["event"] != "start"}


def _executions(journal: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in read_journal(journal):
        if line["event"] == "start":
            counts[line["job"]] = counts.get(line["job"], 0) + 1
    return counts


def test_a_killed_workers_jobs_run_again_on_the_other_within_the_lease(
    start: Callable[..., Node], pg_dsn: str, journal: Path
) -> None:
    """SIGKILL one of two workers mid-run: the jobs it was running start again on the other within
    lease + 1 s of the kill, and every acknowledged job ends, none run more than once past the kill."""
    api = start("serve")
    first, second = start("worker"), start("worker")
    ids = _enqueue(api.url, 40, 0.4)

    _until(lambda: _running_on(journal, first.pid), 10, "the first worker running jobs")
    os.kill(first.pid, signal.SIGKILL)
    killed_at = time.time()
    first.process.wait(timeout=10)
    # Read after the kill: the worker may have started more jobs between a look and the signal.
    held = _running_on(journal, first.pid)
    assert held

    def started_again() -> bool:
        lines = read_journal(journal)
        return held <= {line["job"] for line in lines if line["pid"] == second.pid and line["event"] == "start"}

    _until(started_again, LEASE + 5, "the killed worker's jobs running on the other")
    restarts = [
        line["at"] - killed_at
        for line in read_journal(journal)
        if line["job"] in held and line["pid"] == second.pid and line["event"] == "start"
    ]
    assert max(restarts) <= LEASE + 1.0, restarts
    _until(lambda: _all_succeeded(pg_dsn, ids), 30, "every job succeeded")
    counts = _executions(journal)
    assert set(counts) == set(ids)
    assert all(n == (2 if job in held else 1) for job, n in counts.items()), counts


def test_sigterm_stops_claiming_finishes_running_jobs_and_exits_zero(
    start: Callable[..., Node], pg_dsn: str, journal: Path
) -> None:
    """SIGTERM: the worker stops claiming, its running attempts finish within the grace, it exits 0, and
    nothing is left running under it; the other worker does the rest."""
    api = start("serve")
    leaving, staying = start("worker"), start("worker")
    ids = _enqueue(api.url, 30, 0.5)
    _until(lambda: any(line["pid"] == leaving.pid for line in read_journal(journal)), 10, "the leaving worker running")
    leaving.process.send_signal(signal.SIGTERM)
    assert leaving.process.wait(timeout=3 + 5) == 0
    lines = read_journal(journal)
    mine = [line for line in lines if line["pid"] == leaving.pid]
    started = {line["job"] for line in mine if line["event"] == "start"}
    assert started == {line["job"] for line in mine if line["event"] == "end"}, "a running attempt did not finish"
    with psycopg.connect(pg_dsn) as conn:
        left = conn.execute("SELECT count(*) FROM trioq.jobs WHERE state = 'running' AND node LIKE %s",
                            (f"%-{leaving.pid}-%",)).fetchone()  # fmt: skip
    assert left == (0,)
    _until(lambda: _all_succeeded(pg_dsn, ids), 30, "every job succeeded")
    assert set(_executions(journal).values()) == {1}
    assert staying.process.poll() is None


def test_a_database_restart_mid_run_loses_nothing_and_runs_nothing_twice(
    start: Callable[..., Node], pg_dsn: str, journal: Path, pg_cluster: Cluster | ExternalCluster
) -> None:
    """``pg_ctl restart`` while two workers drain: they reconnect, every job succeeds, each ran once."""
    if not pg_cluster.can_restart:
        pytest.skip("TRIOQ_PG_DSN names a server this test cannot restart")
    api = start("serve")
    start("worker")
    start("worker")
    ids = _enqueue(api.url, 300, 0.02)
    _until(lambda: len(_executions(journal)) >= 20, 10, "jobs running")
    pg_cluster.restart("fast")
    more = _enqueue(api.url, 50, 0.0)  # the API reconnects too
    _until(lambda: _all_succeeded(pg_dsn, ids + more), 60, "every job succeeded after the restart")
    counts = _executions(journal)
    assert set(counts) == set(ids + more)
    assert max(counts.values()) == 1, {job: n for job, n in counts.items() if n > 1}


def test_cancel_through_the_api_stops_the_attempt_running_on_a_worker_within_a_second(
    start: Callable[..., Node], journal: Path
) -> None:
    api = start("serve")
    start("worker")
    (job_id,) = _enqueue(api.url, 1, 1000.0)
    _until(lambda: _executions(journal).get(job_id), 10, "the job running")
    cancelled_at = time.time()
    response = httpx.delete(f"{api.url}/jobs/{job_id}", timeout=5)
    assert response.status_code == 200 and response.json()["state"] == "cancelled", response.text

    def stopped() -> list[float]:
        return [line["at"] for line in read_journal(journal) if line["event"] == "cancelled"]

    (at,) = _until(stopped, 2, "the attempt stopped")
    assert at - cancelled_at < 1.0


def test_when_the_leader_is_killed_another_node_leads(start: Callable[..., Node], pg_dsn: str) -> None:
    nodes = [start("worker"), start("worker")]

    def leader() -> str | None:
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute("SELECT node FROM trioq.leader").fetchone()
        return None if row is None else str(row[0])

    first = _until(leader, 5, "a leader")
    (killed,) = [node for node in nodes if node.node == first]
    os.kill(killed.pid, signal.SIGKILL)
    killed.process.wait(timeout=10)
    (other,) = [node for node in nodes if node is not killed]
    _until(lambda: leader() == other.node, LEASE + 2, "the other node leading")


def test_a_limit_holds_across_nodes_a_sigkill_and_a_database_restart(
    start: Callable[..., Node], pg_dsn: str, journal: Path, pg_cluster: Cluster | ExternalCluster
) -> None:
    """Jobs holding ``pool`` (``max=2``) on two workers of 4: never more than 2 attempts at once by the
    journal, the SIGKILLed worker's slots held until its jobs are rescued (not before), then through
    a database restart (when this cluster can restart); every job succeeds."""
    api = start("serve")
    first = start("worker")
    start("worker")
    ids = _enqueue(api.url, 24, 0.3, task="limited")

    held = _until(lambda: _running_on(journal, first.pid), 10, "the first worker holding a slot")
    os.kill(first.pid, signal.SIGKILL)
    killed_at = time.time()
    first.process.wait(timeout=10)
    held = _running_on(journal, first.pid)  # it may have started more between the look and the signal
    # Until when the killed worker's jobs certainly held their slots: the last look that found them all
    # still running (the rescue, which frees them, comes after it). A rescued job need not be the next
    # to start (older jobs may be waiting), so its restart says nothing of when its slot came free.
    still_held_at = killed_at

    cut_off = {line["job"]: line["epoch"] for line in read_journal(journal) if line["job"] in held}

    def rescued() -> bool:
        nonlocal still_held_at
        looked_at = time.time()
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute("SELECT id, state, epoch FROM trioq.jobs WHERE id = ANY(%s)", (sorted(held),))
            if all(state == "running" and epoch == cut_off[job] for job, state, epoch in rows.fetchall()):
                still_held_at = looked_at  # every one still running under the killed worker's epoch
                return False
        return True

    _until(rescued, LEASE + 5, "the killed worker's jobs rescued")
    if pg_cluster.can_restart:
        _until(lambda: len(_executions(journal)) >= 10, 30, "jobs running after the kill")
        pg_cluster.restart("fast")
    _until(lambda: _all_succeeded(pg_dsn, ids), 60, "every limited job succeeded")

    # Each execution holds a slot from its start to its end; a killed one until the last look that
    # found its job still running (the store frees a dead node's slots only at its rescue, after that).
    lines = read_journal(journal)
    intervals: list[tuple[float, float]] = []
    for line in lines:
        if line["event"] != "start":
            continue
        ends = [
            o["at"] for o in lines if o["job"] == line["job"] and o["epoch"] == line["epoch"] and o["event"] != "start"
        ]
        if ends:
            intervals.append((line["at"], ends[0]))
            continue
        assert line["pid"] == first.pid and line["job"] in held, line
        again = [o["at"] for o in lines if o["job"] == line["job"] and o["event"] == "start" and o["at"] > killed_at]
        assert again, f"{line['job']} never ran again"
        intervals.append((line["at"], still_held_at))
    events = sorted([(at, 1) for at, _ in intervals] + [(at, -1) for _, at in intervals], key=lambda e: (e[0], e[1]))
    holding = peak = 0
    for _, change in events:
        holding += change
        peak = max(peak, holding)
    # On failure, the journal says which executions overlapped (a live node that lost its lease to
    # a starved machine runs on while its job runs elsewhere: look for one job started twice).
    assert peak <= 2, f"{peak} attempts held the pool key at once; journal: {lines}"
    assert peak == 2  # the limit was reached, not only approached
    counts = _executions(journal)
    assert set(counts) == set(ids)
