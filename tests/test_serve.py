"""``trioq serve`` and ``trioq loadgen`` as real processes on 127.0.0.1.

One shared server (WAL, token, ``--max-ready 20``) answers the HTTP tests and
the load generator; the SIGTERM test starts its own on a WAL of its own,
stops it and restarts it on the same directory.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_READY = 20
SERVING = re.compile(r"trioq serving on (http://127\.0\.0\.1:\d+)")


class Server:
    """A ``trioq serve`` child: its process, base URL, and a file holding its stderr."""

    def __init__(self, wal: Path, *extra: str) -> None:
        self.stderr_path = wal.parent / f"{wal.name}.stderr"
        self.stderr = self.stderr_path.open("ab")
        command = [sys.executable, "-m", "trioq.cli", "serve", "--wal", str(wal), "--host", "127.0.0.1"]
        command += ["--port", "0", "--token", TOKEN, "--heartbeat-timeout", "1", *extra]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.stderr, env=_env())
        self.url = self._wait_for_url(timeout=15)

    def _wait_for_url(self, timeout: float) -> str:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        os.set_blocking(fd, False)
        deadline = time.monotonic() + timeout
        buffer = b""
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if selector.select(left):
                    chunk = os.read(fd, 4096)
                    if not chunk:
                        break
                    buffer += chunk
                    if match := SERVING.search(buffer.decode(errors="replace")):
                        return match.group(1)
        self.kill()
        pytest.fail(f"server did not start; stdout {buffer!r}; stderr {self.stderr_text()!r}")

    def stdout_rest(self) -> str:
        """Whatever the (exited) server wrote to stdout after its serving line."""
        assert self.process.stdout is not None
        os.set_blocking(self.process.stdout.fileno(), True)
        return self.process.stdout.read().decode(errors="replace")

    def stderr_text(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self.stderr.close()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRIOQ_TOKEN", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    wal = tmp_path_factory.mktemp("serve") / "wal"
    started = Server(wal, "--max-ready", str(MAX_READY), "--workers", "4")
    try:
        yield started
    finally:
        started.kill()


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=5.0) as c:
        yield c


def _wait_state(client: httpx.Client, job_id: str, states: set[str], timeout: float = 5.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        response = client.get(f"/jobs/{job_id}")
        assert response.status_code == 200, response.text
        job: dict[str, Any] = response.json()
        if job["state"] in states:
            return job
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} still {job['state']} after {timeout}s, wanted {states}")
        time.sleep(0.02)


def test_submit_and_poll_until_succeeded(client: httpx.Client) -> None:
    response = client.post("/jobs", json={"task": "sim", "payload": {"work_ms": 20}})
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["state"] == "ready"
    job = _wait_state(client, body["id"], {"succeeded", "dead"})
    assert job["state"] == "succeeded"
    assert job["result"] == {"work_ms": 20, "attempt": 1}


def test_batch_of_three(client: httpx.Client) -> None:
    jobs = [{"task": "sim", "payload": {"work_ms": n}} for n in (1, 5, 10)]
    response = client.post("/jobs/batch", json={"jobs": jobs})
    assert response.status_code == 202, response.text
    ids = [j["id"] for j in response.json()["jobs"]]
    assert len(set(ids)) == 3
    for job_id in ids:
        assert _wait_state(client, job_id, {"succeeded", "dead"})["state"] == "succeeded"


def test_bad_inputs(server: Server, client: httpx.Client) -> None:
    before = client.get("/stats").json()["totals"]["enqueued"]
    json_headers = {**AUTH, "Content-Type": "application/json"}

    response = client.post("/jobs", content=b'{"task": "sim",', headers=json_headers)
    assert response.status_code == 400 and "malformed JSON" in response.json()["error"]

    response = client.post("/jobs", json={"task": "no-such-task"})
    assert response.status_code == 400 and response.json()["field"] == "task"

    # A fresh connection per request for every answer given before the body is
    # read (401, 413): quart-trio under hypercorn may leave such a keep-alive
    # connection hanging (neither closed nor served); see the report.
    fresh = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=server.url, timeout=5.0, limits=fresh) as anonymous:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            response = anonymous.post("/jobs", json={"task": "sim"}, headers=headers)
            assert response.status_code == 401, headers
            assert response.headers["WWW-Authenticate"] == "Bearer"
        assert anonymous.get("/stats").status_code == 401
        assert anonymous.get("/healthz").status_code == 200  # health needs no token

    huge = b'{"task": "sim", "payload": {"pad": "' + b"x" * (1024 * 1024) + b'"}}'
    with httpx.Client(base_url=server.url, headers=json_headers, timeout=5.0, limits=fresh) as once:
        response = once.post("/jobs", content=huge)
    assert response.status_code == 413 and "over 1048576 bytes" in response.json()["error"]

    assert client.get("/stats").json()["totals"]["enqueued"] == before  # nothing half-accepted


def test_full_queue_answers_503_with_retry_after(client: httpx.Client) -> None:
    ids: list[str] = []
    try:
        delayed = {"task": "sim", "delay": 3600}
        response = client.post("/jobs/batch", json={"jobs": [delayed] * MAX_READY})
        assert response.status_code == 202, response.text
        ids += [j["id"] for j in response.json()["jobs"]]
        for _ in range(2):  # single and batch submissions are both refused
            response = client.post("/jobs", json={"task": "sim"})
            assert response.status_code == 503, response.text
            assert int(response.headers["Retry-After"]) >= 1
            response = client.post("/jobs/batch", json={"jobs": [{"task": "sim"}]})
            assert response.status_code == 503
            assert "Retry-After" in response.headers
    finally:  # free the shared server for the other tests
        for job_id in ids:
            client.delete(f"/jobs/{job_id}")
    response = client.post("/jobs", json={"task": "sim", "payload": {"work_ms": 1}})
    assert response.status_code == 202, response.text


def test_loadgen_prints_one_json_line(server: Server) -> None:
    command = [sys.executable, "-m", "trioq.cli", "loadgen", "--url", server.url, "--jobs", "50"]
    command += ["--clients", "4", "--batch", "10", "--work-ms", "5", "--token", TOKEN, "--timeout", "20"]
    done = subprocess.run(command, capture_output=True, timeout=30, env=_env())
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1, lines
    summary = json.loads(lines[0])
    assert set(summary) == {
        "jobs",
        "done",
        "dead",
        "completion_pct",
        "retried",
        "requeued",
        "submit_s",
        "total_s",
        "throughput_jobs_s",
        "latency_p50_ms",
        "latency_p99_ms",
    }
    assert summary["jobs"] == summary["done"] == 50
    assert summary["dead"] == 0 and summary["completion_pct"] == 100.0


def test_sigterm_exits_0_and_releases_the_running_job(tmp_path: Path) -> None:
    wal = tmp_path / "wal"
    first = Server(wal, "--workers", "2", "--shutdown-grace", "0.5")
    try:
        with httpx.Client(base_url=first.url, headers=AUTH, timeout=5.0) as client:
            response = client.post("/jobs", json={"task": "sim", "payload": {"work_ms": 60000}})
            assert response.status_code == 202, response.text
            job_id = response.json()["id"]
            assert _wait_state(client, job_id, {"running"})["attempts"] == 0
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=8) == 0, first.stderr_text()
        assert "draining" in first.stdout_rest()
    finally:
        first.kill()

    second = Server(wal, "--workers", "2", "--shutdown-grace", "0")
    try:
        with httpx.Client(base_url=second.url, headers=AUTH, timeout=5.0) as client:
            job = _wait_state(client, job_id, {"ready", "running", "succeeded", "dead", "cancelled"})
            assert job["state"] in {"ready", "running"}, job
            # The cut-off attempt was released, not counted (attempts counts ended attempts).
            assert job["attempts"] == 0, job
            assert job["error"] is None, job
        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(timeout=8) == 0, second.stderr_text()
    finally:
        second.kill()


def test_serve_adds_the_builtin_tasks_to_a_users_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trioq._serve import load_registry

    (tmp_path / "myapp.py").write_text(
        "import trioq\nregistry = trioq.Registry()\n\n@registry.task\nasync def mine(ctx):\n    return 1\n"
        "not_a_registry = 3\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert set(load_registry(None)) == {"sim", "cpu"}
    assert set(load_registry("myapp:registry")) == {"mine", "sim", "cpu"}
    assert set(load_registry("myapp:registry")) == {"mine", "sim", "cpu"}  # the user's registry is untouched
    for bad, message in [("myapp", "module:registry"), ("nope:registry", "nope"), ("myapp:not_a_registry", "int")]:
        with pytest.raises(SystemExit, match=message):
            load_registry(bad)
