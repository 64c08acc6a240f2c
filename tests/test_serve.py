"""``trioq serve`` and ``trioq loadgen`` as real processes on 127.0.0.1.

One shared server (WAL, token, ``--max-ready 20``) answers the HTTP tests and
the load generator; the SIGTERM test starts its own on a WAL of its own,
stops it and restarts it on the same directory. The connection tests run
``trioq serve``'s app and hypercorn settings in-process instead (a small
``max_body``, a short keep-alive) and speak raw HTTP/1.1 over a socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import trioq
import trioq.http
from trioq._app.cli import main
from trioq._app.serve import AUTH_OFF, AUTH_ON, hypercorn_config, serve
from trioq.http import create_app

from .apps import make_registry
from .processes import read_until

pytestmark = pytest.mark.slow

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_READY = 20
#: The startup banner, a block ending with its queues line (see trioq._app.serve.serve).
SERVING = re.compile(r"trioq serving on (http://127\.0\.0\.1:\d+)\n(?:  .*\n)*?  queues: .*\n")


class Server:
    """A ``trioq serve`` child: its process, base URL, and a file holding its stderr."""

    def __init__(self, wal: Path, *extra: str) -> None:
        self.stderr_path = wal.parent / f"{wal.name}.stderr"
        self.stderr = self.stderr_path.open("ab")
        command = [sys.executable, "-m", "trioq", "serve", "--wal", str(wal), "--host", "127.0.0.1"]
        command += ["--port", "0", "--token", TOKEN, "--heartbeat-timeout", "1", *extra]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.stderr, env=_env())
        self.banner = ""
        self.url = self._wait_for_url(timeout=15)

    def _wait_for_url(self, timeout: float) -> str:
        match, buffer = read_until(self.process, SERVING, timeout)
        if match is not None:
            self.banner = match.group(0)
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


def test_submit_and_poll_until_succeeded(server: Server, client: httpx.Client) -> None:
    assert f"\n  {AUTH_ON}\n" in server.banner, server.banner
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

    # 401 and 413 close the connection (the body is not read); the client reconnects.
    with httpx.Client(base_url=server.url, timeout=5.0) as anonymous:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            response = anonymous.post("/jobs", json={"task": "sim"}, headers=headers)
            assert response.status_code == 401, headers
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert response.headers["Connection"] == "close"
        assert anonymous.get("/stats").status_code == 401
        assert anonymous.get("/healthz").status_code == 200  # health needs no token

    huge = b'{"task": "sim", "payload": {"pad": "' + b"x" * (1024 * 1024) + b'"}}'
    response = client.post("/jobs", content=huge, headers=json_headers)
    assert response.status_code == 413 and "over 1048576 bytes" in response.json()["error"]
    assert response.headers["Connection"] == "close"

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
    command = [sys.executable, "-m", "trioq", "loadgen", "--url", server.url, "--jobs", "50"]
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


MYAPP = (
    "import trioq\nregistry = trioq.Registry()\n\n@registry.task(queue='email')\nasync def mine(ctx):\n    return 1\n"
    "not_a_registry = 3\n"
)


def test_serve_adds_the_demo_tasks_to_a_users_registry_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trioq._app.serve import load_registry

    (tmp_path / "myapp.py").write_text(MYAPP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert set(load_registry(None)) == {"sim", "cpu"}  # plain `trioq serve`: the demo's tasks
    assert set(load_registry("myapp:registry")) == {"mine"}  # the user's registry, as it is
    assert set(load_registry("myapp:registry", demo_tasks=True)) == {"mine", "sim", "cpu"}
    assert set(load_registry("myapp:registry")) == {"mine"}  # the user's registry is untouched
    for bad, message in [("myapp", "module:registry"), ("nope:registry", "nope"), ("myapp:not_a_registry", "int")]:
        with pytest.raises(SystemExit, match=message):
            load_registry(bad)


# ------------------------------------------------------------- the token


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        (["--token", ""], None, "--token is empty"),  # the README's --token "$TOKEN" with TOKEN unset
        (["--token", " \t"], None, "--token is only whitespace"),
        ([], "", "TRIOQ_TOKEN is empty"),
        ([], "  ", "TRIOQ_TOKEN is only whitespace"),
        (["--token", "pässword"], None, "--token holds 'ä'"),
        (["--token", ""], "good-token", "--token is empty"),  # not quietly replaced by the environment's
    ],
)
def test_serve_refuses_an_unusable_token(
    argv: list[str], env: str | None, said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    served: list[Any] = []

    async def record(args: Any) -> None:  # stands in for the server: the test must never block
        served.append(args)

    monkeypatch.setattr("trioq._app.serve.serve", record)
    if env is None:
        monkeypatch.delenv("TRIOQ_TOKEN", raising=False)
    else:
        monkeypatch.setenv("TRIOQ_TOKEN", env)
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--memory", "--port", "0", *argv])
    assert exited.value.code == 2 and not served
    error = capsys.readouterr().err
    assert said in error and "omit --token and unset TRIOQ_TOKEN" in error, error


def test_serve_takes_the_token_from_the_flag_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[Any] = []

    async def record(args: Any) -> None:
        served.append(args.token)

    monkeypatch.setattr("trioq._app.serve.serve", record)
    monkeypatch.delenv("TRIOQ_TOKEN", raising=False)
    assert main(["serve", "--memory"]) == 0
    assert main(["serve", "--memory", "--token", "from-flag"]) == 0
    monkeypatch.setenv("TRIOQ_TOKEN", "from-env")
    assert main(["serve", "--memory"]) == 0
    assert main(["serve", "--memory", "--token", "from-flag"]) == 0
    assert served == [None, "from-flag", "from-env", "from-flag"]


@pytest.mark.parametrize(
    ("argv", "token", "said"),
    [
        ([], None, [AUTH_OFF, "store: memory", "workers: 16 in one pool", "queues: default (2 tasks: cpu, sim)"]),
        (
            ["--app", "myapp:registry", "--workers", "default=2,email=1"],
            "t0ken",
            [
                AUTH_ON,
                "workers: default=2, email=1 (a pool per queue)",
                "queues: default (0 tasks); email (1 task: mine)",
            ],
        ),
        (
            ["--app", "myapp:registry", "--demo-tasks", "--workers", "email=1"],
            None,
            ["queues: default (2 tasks: cpu, sim; not run here); email (1 task: mine)"],
        ),
    ],
)
async def test_the_startup_banner_says_where_what_and_whether_auth_is_on(
    argv: list[str],
    token: str | None,
    said: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trioq._app.cli import _parser

    (tmp_path / "myapp.py").write_text(MYAPP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = _parser().parse_args(["serve", "--memory", "--host", "127.0.0.1", "--port", "0", *argv])
    args.token = token
    out = ""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, args)
            while "  queues: " not in out:
                await trio.sleep(0.01)
                out += capsys.readouterr().out
            nursery.cancel_scope.cancel()
    first, *block = out.splitlines()
    assert re.fullmatch(r"trioq serving on http://127\.0\.0\.1:\d+", first), out
    assert [line[:2] for line in block] == ["  "] * 4 and [line.split(":")[0].strip() for line in block] == [
        "auth",
        "store",
        "workers",
        "queues",
    ], out
    for line in said:
        assert any(shown.strip().startswith(line) for shown in block), (line, out)


def test_failures_reach_serves_stderr_as_log_lines(server: Server, client: httpx.Client) -> None:
    response = client.post("/jobs", json={"task": "sim", "payload": {"fail_prob": 1.0}, "max_attempts": 1})
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    assert _wait_state(client, job_id, {"dead"})["state"] == "dead"
    wanted = f"ERROR trioq: job {job_id} (sim) is dead after attempt 1: RuntimeError: simulated failure"
    deadline = time.monotonic() + 5
    while wanted not in server.stderr_text():  # the log line is written as the job dies: soon after
        assert time.monotonic() < deadline, server.stderr_text()[-2000:]
        time.sleep(0.02)


# ------------------------------------------------- connections that end


@asynccontextmanager
async def live_app(*, token: str | None = None, max_body: int = 1024) -> AsyncIterator[int]:
    """``create_app`` on a queue, under hypercorn with ``trioq serve``'s settings on 127.0.0.1; yields the port.

    Keep-alive is 0.5 s, so an idle connection must be closed well within the tests' 2 s.
    """
    from hypercorn.trio import serve as hypercorn_serve

    async with trioq.open_queue(make_registry(), workers=0) as queue:
        config = hypercorn_config("127.0.0.1:0")
        config.keep_alive_timeout = 0.5
        config.graceful_timeout = 0.1
        app = create_app(queue, token=token, max_body=max_body)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(hypercorn_serve, app, config, shutdown_trigger=stop.wait))
            try:
                yield int(binds[0].rsplit(":", 1)[1])
            finally:
                stop.set()


async def _exchange(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send ``data`` on a new connection and read until the server closes it, for at most 2 s.

    Returns what came back, and whether the server closed the connection in that time.
    """
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        received = b""
        with trio.move_on_after(2.0) as waiting:
            try:
                await stream.send_all(data)
                while chunk := await stream.receive_some(65536):
                    received += chunk
            except trio.BrokenResourceError:  # a reset: closed, and whatever was lost shows below
                pass
    return received, not waiting.cancelled_caught


def _head(received: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    """The status line and the (lowercased) headers of the first response in ``received``."""
    status, *lines = received.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    return status, {name.lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines)}


async def test_answers_that_end_the_connection_close_it() -> None:
    # 413 and 401 leave the request body unread, so the connection cannot carry another request:
    # the answer says "Connection: close" and the socket is closed at once, never left hanging
    # (a client that sends its next request after reading the answer finds the connection closed,
    # and opens another). No request is pipelined behind a refused body: hypercorn 0.18 then fails
    # h11's "data after the close" check and closes the socket from its reading task while the answer
    # is being written (TCPServer._close takes no send lock), so the answer may be lost.
    auth = b"Authorization: Bearer t0ken\r\n"
    post = b"POST /jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    piece = b'{"task": "echo", "payload": {"text": "' + b"x" * 1000
    chunked = post + auth + b"Transfer-Encoding: chunked\r\n\r\n" + (b"%x\r\n%s\r\n" % (len(piece), piece)) * 4
    ping = b"GET /healthz HTTP/1.1\r\nHost: t\r\n"
    cases = [
        ("chunked, over max_body", chunked + b"0\r\n\r\n", b"413", True),
        ("chunked, over max_body, the rest still to come", chunked, b"413", True),
        ("Content-Length over max_body, body sent", post + b"Content-Length: 4000\r\n\r\n" + b"x" * 4000, b"413", True),
        ("Content-Length over max_body, body not sent", post + b"Content-Length: 4000\r\n\r\n", b"413", True),
        ("no token", post + b"Content-Length: 2\r\n\r\n{}", b"401", True),
        (
            "no token, the body not sent (the 401 waits no minute for it)",
            post + b"Content-Length: 100\r\n\r\n",
            b"401",
            True,
        ),
        (
            "two Authorization headers",
            post + auth + b"Authorization: Bearer bad\r\nContent-Length: 2\r\n\r\n{}",
            b"401",
            True,
        ),
        (
            "no route, the body still to come",
            b"PUT /nope HTTP/1.1\r\nHost: t\r\nContent-Length: 900\r\n\r\nxx",
            b"404",
            True,
        ),
        (
            "wrong method, the body still to come",
            b"PUT /jobs HTTP/1.1\r\nHost: t\r\nContent-Length: 900\r\n\r\nxx",
            b"405",
            True,
        ),
        ("no path", b"GET ? HTTP/1.1\r\nHost: t\r\n\r\n", b"400", True),
        ("the client asks to close", ping + b"Connection: close\r\n\r\n", b"200", False),
        ("idle past keep-alive", ping + b"\r\n", b"200", False),
    ]
    with trio.fail_after(30):
        async with live_app(token="t0ken") as port:
            for name, data, status, says_close in cases:
                received, closed = await _exchange(port, data)
                line, headers = _head(received)
                assert line.startswith(b"HTTP/1.1 " + status), (name, received[:300])
                assert closed, f"{name}: the server kept the connection open"
                assert received.count(b"HTTP/1.1 ") == 1, (name, received)
                if says_close:
                    assert headers.get(b"connection") == b"close", (name, headers)


async def _read_response(stream: trio.SocketStream, buffered: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One response from ``stream`` (after ``buffered``): its head, headers, and what came after it."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed mid-response after {data!r}"
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    line, headers = _head(head + b"\r\n\r\n")
    length = int(headers.get(b"content-length", b"0"))
    while len(rest) < length:
        chunk = await stream.receive_some(65536)
        assert chunk, "closed mid-body"
        rest += chunk
    return line, headers, rest[length:]


async def test_answers_to_requests_without_a_body_keep_the_connection() -> None:
    # Connection: close was added whenever the answer started before Quart had
    # seen the end of the request body, which for a request without one was a
    # race: health checks, 404s and DELETEs closed their connection at random.
    requests = [
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /openapi.json HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /nosuchroute HTTP/1.1\r\nHost: t\r\n\r\n",
        b"DELETE /jobs/nope HTTP/1.1\r\nHost: t\r\n\r\n",
        b"POST /jobs/nope/retry HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n",
        b"GET /stats HTTP/1.1\r\nHost: t\r\n\r\n",
    ]
    with trio.fail_after(20):
        async with live_app() as port:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            async with stream:
                left = b""
                for _ in range(20):
                    for request in requests:
                        await stream.send_all(request)
                        line, headers, left = await _read_response(stream, left)
                        assert headers.get(b"connection") != b"close", (request, line, headers)


async def test_the_blueprint_in_a_host_app_closes_connections_too() -> None:
    # Only create_app's app had the connection class that lets hypercorn close:
    # a host app mounting the blueprint left a 401's or 413's connection open.
    from hypercorn.trio import serve as hypercorn_serve
    from quart_trio import QuartTrio

    post = b"POST /q/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    with trio.fail_after(20):
        async with trioq.open_queue(make_registry(), workers=0) as queue:
            host = QuartTrio("host")
            host.register_blueprint(trioq.http.blueprint(queue, token="t0ken", max_body=1024), url_prefix="/q")
            config = hypercorn_config("127.0.0.1:0")
            config.graceful_timeout = 0.1
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(partial(hypercorn_serve, host, config, shutdown_trigger=stop.wait))
                port = int(binds[0].rsplit(":", 1)[1])
                for data, status in [
                    (post + b"Authorization: Bearer t0ken\r\nContent-Length: 4000\r\n\r\n", b"413"),
                    (post + b"Content-Length: 2\r\n\r\n{}", b"401"),
                ]:
                    received, closed = await _exchange(port, data)
                    assert received.startswith(b"HTTP/1.1 " + status), received[:200]
                    assert closed, f"the host app kept the connection open after {status!r}"
                stop.set()


def test_no_client_can_stop_trioq_serve(tmp_path: Path) -> None:
    # A request that says it closes, with bytes behind it, made hypercorn reply
    # while its own close was sending EOF: trio.BusyResourceError left the
    # connection's handler and ended the whole server, for anyone, token or not.
    served = Server(tmp_path / "wal")
    try:
        host, port = served.url.removeprefix("http://").split(":")
        requests = [
            b"POST /jobs HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}X",
            b"POST /jobs HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}X",
        ]
        for n in range(120):
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.settimeout(5.0)
                sock.sendall(requests[n % 2])
                with contextlib.suppress(ConnectionError):
                    while sock.recv(65536):
                        pass
            assert served.process.poll() is None, f"trioq serve exited after {n + 1} requests: {served.stderr_text()}"
        with httpx.Client(base_url=served.url, timeout=5) as client:
            assert client.get("/healthz").status_code == 200
    finally:
        served.kill()


def test_trioq_serve_closes_the_connection_after_a_413(server: Server) -> None:
    # The real command, too: an over-long Content-Length is refused before the body is sent.
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.settimeout(2.0)
        sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n")
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            pytest.fail(f"trioq serve kept the connection open after {received[:200]!r}")
    assert received.startswith(b"HTTP/1.1 413"), received[:200]


def test_the_connection_class_swap_outlives_every_serve_but_the_last() -> None:
    # Two serve() calls in one process, the first to start leaving first: the
    # second must keep the contained connection class.
    from hypercorn.trio import run as hypercorn_run

    from trioq._app.serve import _connections_contained

    original = hypercorn_run.TCPServer  # type: ignore[attr-defined]
    first, second = _connections_contained(), _connections_contained()
    first.__enter__()
    swapped = hypercorn_run.TCPServer  # type: ignore[attr-defined]
    assert swapped is not original
    second.__enter__()
    first.__exit__(None, None, None)
    assert hypercorn_run.TCPServer is swapped  # type: ignore[attr-defined]
    second.__exit__(None, None, None)
    assert hypercorn_run.TCPServer is original  # type: ignore[attr-defined]


def test_workers_takes_a_count_or_a_pool_per_named_queue(capsys: pytest.CaptureFixture[str]) -> None:
    from trioq._app.cli import _parser

    parse = _parser().parse_args
    assert parse(["worker", "--postgres", "x", "--workers", "3"]).workers == 3
    assert parse(["serve", "--workers", "default=8,email=4"]).workers == {"default": 8, "email": 4}
    for bad in ("-1", "x", "a=0", "a=1,a=2", "=3", "a=b", "a=1,"):
        with pytest.raises(SystemExit) as exited:
            parse(["serve", "--workers", bad])
        assert exited.value.code == 2
        assert "--workers" in capsys.readouterr().err


def test_serve_overflow_defer_needs_max_ready(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    served: list[Any] = []

    async def record(args: Any) -> None:  # stands in for the server: the test must never block
        served.append(args)

    monkeypatch.setattr("trioq._app.serve.serve", record)
    monkeypatch.delenv("TRIOQ_TOKEN", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--memory", "--port", "0", "--overflow", "defer"])
    assert exited.value.code == 2 and not served
    assert "--overflow defer needs --max-ready" in capsys.readouterr().err
    assert main(["serve", "--memory", "--port", "0", "--overflow", "defer", "--max-ready", "5"]) == 0
    assert [(args.overflow, args.max_ready) for args in served] == [("defer", 5)]
