"""The examples under examples/: the diagnoser and the blueprint app through Quart's
test client on the autojump clock, and the served examples as real processes."""

from __future__ import annotations

import importlib.util
import inspect
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import trioq

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` without running its ``__main__`` block."""
    spec = importlib.util.spec_from_file_location(f"trioq_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


diagnoser = load("diagnoser")
blueprint_app = load("blueprint_app")


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[tuple[trioq.Queue, Any]]:
    """The diagnoser's queue (opened with ``options``) and a test client of its app."""
    async with trioq.open_queue(diagnoser.registry, **options) as queue:
        app = diagnoser.build(queue, token=TOKEN)
        async with app.test_app() as test_app:
            yield queue, test_app.test_client()


async def submit(client: Any, checks: list[str], *, target: str = "example.com", timeout_s: float = 1.0) -> Any:
    payload = {"target": target, "checks": checks, "timeout_s": timeout_s}
    return await client.post("/jobs", json={"task": "diagnose", "payload": payload}, headers=AUTH)


async def poll(client: Any, job_id: str, state: str = "succeeded") -> dict[str, Any]:
    """GET /jobs/<id> until the job is in ``state``."""
    with trio.fail_after(600):
        while True:
            response = await client.get(f"/jobs/{job_id}", headers=AUTH)
            assert response.status_code == 200
            job: dict[str, Any] = await response.get_json()
            if job["state"] == state:
                return job
            assert job["state"] not in {"succeeded", "dead", "cancelled"}, job
            await trio.sleep(0.01)


# ---------------------------------------------------------------- diagnoser


async def test_diagnose_reports_every_check_in_the_order_asked(autojump_clock: trio.testing.MockClock) -> None:
    checks = ["http", "slow", "dns", "disk", "tcp"]
    async with serving(workers=2) as (_queue, client):
        response = await submit(client, checks, timeout_s=1.0)
        assert response.status_code == 202
        job = await poll(client, (await response.get_json())["id"])
    assert job["attempts"] == 1
    assert [result["check"] for result in job["result"]] == checks
    assert all(set(result) == {"check", "status", "detail"} for result in job["result"])
    statuses = {result["check"]: result["status"] for result in job["result"]}
    assert statuses == {"http": "ok", "slow": "timeout", "dns": "ok", "disk": "ok", "tcp": "ok"}
    # The checks ran side by side: the report took the timeout, not the sum.
    assert 1.0 <= job["finished_at"] - job["created_at"] < 1.05


async def test_each_check_has_its_own_deadline(autojump_clock: trio.testing.MockClock) -> None:
    # Three checks that never answer cost one timeout, not three; http (0.3 s)
    # misses a 0.2 s deadline while dns (0.05 s) makes it.
    checks = ["slow", "http", "slow", "dns", "slow"]
    async with serving(workers=1) as (_queue, client):
        job = await poll(client, (await (await submit(client, checks, timeout_s=0.2)).get_json())["id"])
    assert [result["status"] for result in job["result"]] == ["timeout", "timeout", "timeout", "ok", "timeout"]
    assert job["result"][0]["detail"] == "no answer within 0.2s"
    assert 0.2 <= job["finished_at"] - job["created_at"] < 0.25


async def test_failing_and_unknown_checks_are_reported_not_retried(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(workers=1) as (_queue, client):
        response = await submit(client, ["dns", "ping", "tcp"], target="nowhere.invalid")
        job = await poll(client, (await response.get_json())["id"])
    assert [(r["check"], r["status"]) for r in job["result"]] == [("dns", "fail"), ("ping", "unknown"), ("tcp", "ok")]
    assert "NXDOMAIN" in job["result"][0]["detail"]
    # A payload that does not fit the handler's annotations is refused at once (checks: list[str]).
    async with serving(workers=1) as (queue, client):
        response = await submit(client, "dns", timeout_s=1)  # type: ignore[arg-type]
        assert response.status_code == 400
        body = await response.get_json()
        assert body["field"] == "payload" and "'checks' must be list" in body["error"]
        assert (await queue.stats())["totals"]["enqueued"] == 0


async def test_an_overloaded_diagnoser_answers_503_with_retry_after(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(workers=1, max_ready=2) as (queue, client):
        first = (await (await submit(client, ["slow"], timeout_s=60)).get_json())["id"]
        await poll(client, first, "running")  # the only worker is busy for a minute
        for _ in range(2):
            assert (await submit(client, ["dns"])).status_code == 202
        response = await submit(client, ["dns"])
        assert response.status_code == 503
        assert int(response.headers["Retry-After"]) >= 1
        assert "full" in (await response.get_json())["error"]
        assert (await queue.stats())["totals"]["enqueued"] == 3  # nothing half-accepted
        # Once the backlog drains, the same request is accepted.
        await queue.join()
        assert (await submit(client, ["dns"])).status_code == 202


async def test_shutdown_leaves_no_diagnosis_in_limbo(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    wal = tmp_path / "wal"
    async with serving(store=trioq.WALStore(wal), workers=2, shutdown_grace=0.5) as (_queue, client):
        stuck = (await (await submit(client, ["slow"], timeout_s=60)).get_json())["id"]
        quick = (await (await submit(client, ["http"])).get_json())["id"]
        await poll(client, stuck, "running")
        await poll(client, quick, "running")
    # Reopened, as after a restart: the quick one finished within the grace; the
    # stuck one is ready to run again, its cut-off attempt not counted.
    async with trioq.open_queue(diagnoser.registry, store=trioq.WALStore(wal), workers=0) as queue:
        job = await queue.get(stuck)
        assert job.state == "ready" and job.attempts == 0
        done = await queue.get(quick)
        assert done.state == "succeeded" and done.result[0]["status"] == "ok"
        assert (await queue.stats())["jobs"]["running"] == 0


async def test_diagnoser_lists_its_checks(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(workers=0) as (_queue, client):
        response = await client.get("/checks", headers=AUTH)
        assert (await response.get_json()) == {"checks": ["disk", "dns", "http", "slow", "tcp"]}


# ------------------------------------------------------------ blueprint app


async def test_blueprint_app_opens_and_closes_the_queue_with_the_app(autojump_clock: trio.testing.MockClock) -> None:
    app = blueprint_app.make_app(TOKEN)
    assert "trioq" not in app.extensions  # no queue before the app serves
    async with app.test_app() as test_app:
        client = test_app.test_client()
        queue = app.extensions["trioq"]
        assert queue.readiness() == (True, "ok")
        # The app's own route enqueues; trioq's routes under /queue report.
        response = await client.post("/thumbnails", json={"image": "cat.png"})
        assert response.status_code == 202
        body = await response.get_json()
        await queue.wait(body["id"])
        assert (await client.get(body["poll"])).status_code == 401  # the blueprint's token
        job = await (await client.get(body["poll"], headers=AUTH)).get_json()
        assert job["state"] == "succeeded" and job["result"]["thumbnail"] == "cat-128w.png"
        response = await client.post("/queue/jobs", json={"task": "thumbnail", "payload": {"image": "dog.png"}})
        assert response.status_code == 401
        response = await client.post(
            "/queue/jobs", json={"task": "thumbnail", "payload": {"image": "dog.png"}}, headers=AUTH
        )
        assert response.status_code == 202
        assert (await queue.wait((await response.get_json())["id"])).state == "succeeded"
    # Serving over, the queue is closed too.
    assert queue.readiness() == (False, "the queue is shutting down")
    assert "trioq.stop" not in app.extensions
    with pytest.raises(trioq.TrioqError, match="shutting down"):
        await queue.enqueue("thumbnail", {"image": "late.png"})


# ------------------------------------------------------- served as processes


def test_http_app_imports_without_serving() -> None:
    http_app = load("http_app")
    assert "greet" in http_app.registry
    assert inspect.iscoroutinefunction(http_app.main)
    assert callable(diagnoser.main) and callable(blueprint_app.make_app)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.slow
@pytest.mark.parametrize(
    ("example", "argv", "job"),
    [
        ("http_app", lambda port, data: [str(port), data], {"task": "greet", "payload": {"name": "Ada"}}),
        (
            "diagnoser",
            lambda port, data: ["--port", str(port), "--data", data],
            {"task": "diagnose", "payload": {"target": "example.com", "checks": ["dns", "tcp"]}},
        ),
    ],
)
def test_example_serves_and_shuts_down_on_sigterm(tmp_path: Path, example: str, argv: Any, job: Any) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, str(EXAMPLES / f"{example}.py"), *argv(port, str(tmp_path / "data"))]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                if httpx.get(f"{base}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the example never answered /healthz"
            time.sleep(0.05)
        response = httpx.post(f"{base}/jobs", json=job, timeout=2)
        assert response.status_code == 202
        job_id = response.json()["id"]
        while httpx.get(f"{base}/jobs/{job_id}", timeout=2).json()["state"] != "succeeded":
            assert time.monotonic() < deadline, "the job never succeeded"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
