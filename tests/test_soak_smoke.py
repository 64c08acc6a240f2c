"""A 35-second run of the chaos soak (``benchmarks/soak/``) on PostgreSQL, as a user runs it.

Two worker processes on a throwaway cluster, SIGKILLs and SIGTERMs about
every 6 s, one server restart: the verdict (from the handlers' side journal,
not the store's counters) must be clean, so a regression in recovery cannot
land unseen. One of the two is a ``trioq serve --postgres`` that takes the
enqueues while it answers (``--feed serve``), so that enqueues claim jobs for
its idle workers and it is killed holding them. The long runs are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pgcluster import DSN_ENV, find_bindir, no_postgres

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def test_soak_smoke_postgres(tmp_path: Path) -> None:
    if find_bindir() is None and not os.environ.get(DSN_ENV):
        no_postgres("no PostgreSQL binaries found (apt-get install postgresql), and TRIOQ_PG_DSN is not set")
    command = [sys.executable, "-m", "benchmarks.soak", "--store", "postgres", "--duration", "35s"]
    command += ["--rate", "40", "--workers", "2", "--slots", "8", "--kill-every", "6", "--slow-seconds", "6"]
    command += ["--db-restart-every", "20", "--drain-timeout", "90", "--out", str(tmp_path / "run"), "--no-save"]
    command += ["--feed", "serve"]
    if os.environ.get(DSN_ENV):
        command += ["--dsn", os.environ[DSN_ENV]]
    # Its own process group: on a timeout the harness and everything it started are killed together.
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the soak did not end in 400 s:\n{err.decode(errors='replace')[-4000:]}")
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line from the soak (exit {proc.returncode}):\n{stderr[-4000:]}"
    line = json.loads(lines[-1])
    verdict = line["verdict"]
    detail = f"{stderr[-3000:]}\n{json.dumps(line)[:3000]}"
    assert proc.returncode == 0, detail
    assert verdict["ok"] is True, detail
    # The chaos happened, and the journal saw its effects: otherwise a clean verdict says nothing.
    assert line["chaos"]["sigkill"] >= 1 and line["chaos"]["sigterm"] >= 1, line["chaos"]
    if not os.environ.get(DSN_ENV):
        assert line["chaos"]["db_restart"] == 1, line["chaos"]
    assert verdict["interrupted"] >= 1 and verdict["jobs"] >= 1000, verdict
    assert line["load"]["running_at_ack"] >= 1, line["load"]  # some enqueues claimed for the server's workers
    assert verdict["fan_in"]["ran"] >= 10 and verdict["cron"]["ticks"] >= 3, verdict
    for key, limit in verdict["limits"].items():
        assert 1 <= limit["peak"] <= limit["max"], (key, limit)
    assert line["drained"] is True and line["processes"]["unexpected_exits"] == [], detail
    assert set(line["processes"]["final_exit_codes"]) == {0}, line["processes"]
    assert all(value == 0 for value in line["store_checks"].values()), line["store_checks"]
