"""The ``trioq`` command as a new user first meets it: help, version, banner, logs, and errors.

Each error is checked on a real process: its exit status, one line on stderr,
no traceback and no internal names. One server (a WAL, a token from
``TRIOQ_TOKEN``, JSON logs, a user's registry with ``--demo-tasks``) is the
other process that holds the port and the WAL directory, and the server
``trioq loadgen`` talks to.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import trioq
from trioq._app.cli import _parser

from .processes import read_until

TOKEN = "first-hour-token"
BANNER = re.compile(r"trioq serving on (http://127\.0\.0\.1:(\d+))\n(?:  .*\n)*?  queues: .*\n")
MYAPP = (
    "import trioq\nregistry = trioq.Registry()\n\n@registry.task(queue='email')\nasync def mine(ctx):\n    return 1\n"
)


def _env(**more: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TRIOQ_TOKEN", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(more)
    return env


def trioq_run(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioq", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env() if env is None else env,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str], status: int = 1) -> str:
    """The one line a failed command wrote on stderr (after checking there is exactly one, and no traceback)."""
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith(f"trioq {done.args[3]}: "), line  # [python, -m, trioq, COMMAND, ...]
    for internal in ("trioq._", "Namespace", "<class", "Error:", "_command"):
        assert internal not in line, line
    return line


# ------------------------------------------------------------- help and version


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_option_of_every_command_has_a_sentence_and_shows_its_default() -> None:
    checked = 0
    for parser in _parsers(_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
                continue
            where = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
            assert action.help and len(action.help) > 10, where
            if action.option_strings and action.default not in (None, False) and not action.required:
                assert "default" in (formatter._get_help_string(action) or ""), where
            checked += 1
    assert checked > 80


@pytest.mark.slow
def test_help_shows_defaults_and_what_heartbeat_timeout_does() -> None:
    done = trioq_run("serve", "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for said in ("(default: 16)", "(default: ./trioq-data)", "(default: 8000)", "(default: INFO)", "(default: 3600"):
        assert said in text, said
    assert "the heartbeat timeout of tasks that set no heartbeat_timeout of their own" in text
    assert "--retention S" in text and "--max-retained N" in text and "--demo-tasks" in text


@pytest.mark.slow
def test_version_and_bare_trioq() -> None:
    done = trioq_run("--version")
    assert (done.returncode, done.stdout) == (0, f"trioq {trioq.__version__}\n"), done.stderr
    done = trioq_run()  # the whole help, on stderr, and exit status 2: no command was given
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("usage: trioq [-h] [--version] COMMAND ...")
    for command in ("serve", "worker", "loadgen", "demo", "wal", "jobs"):
        assert re.search(rf"^    {command}\s+\w", done.stderr, flags=re.M), command
    assert done.stderr.endswith("trioq: error: give a command\n")


def test_the_banner_never_shows_a_postgres_password() -> None:
    from trioq._app.serve import store_line

    store: Any = object()  # a PostgresStore, as far as store_line looks
    for dsn in ("postgresql://app:s3cret@db:5433/app", "host=db password=s3cret dbname=app port=5433"):
        args = argparse.Namespace(postgres=dsn, schema="trioq", lease=30.0)
        shown = store_line(store, args)
        assert "s3cret" not in shown and "host=db" in shown and "port=5433" in shown, shown
        assert shown.endswith("(schema trioq, lease 30s)"), shown


# ------------------------------------------------------------- errors without a server


@pytest.mark.slow
def test_serve_without_the_http_extra_says_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['quart_trio'] = None  # not installed\n")
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = trioq_run("serve", "--memory", "--port", "0", env=_env(PYTHONPATH=path))
    line = one_line_error(done)
    assert "needs the http extra" in line and "pip install 'trioq[http]'" in line, line


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_loadgen_at_a_closed_port_or_without_a_scheme() -> None:
    port = _free_port()  # closed again: nothing listens there
    line = one_line_error(trioq_run("loadgen", "--url", f"http://127.0.0.1:{port}", "--jobs", "1"))
    assert f"cannot reach http://127.0.0.1:{port}" in line and "is trioq serve running there?" in line, line
    line = one_line_error(trioq_run("loadgen", "--url", f"127.0.0.1:{port}"), status=2)
    assert f"e.g. http://127.0.0.1:{port}" in line, line


# ------------------------------------------------------------- against a running server


class Held:
    """A ``trioq serve`` child holding a port and a WAL directory; its stderr goes to a file."""

    def __init__(self, directory: Path) -> None:
        (directory / "myapp.py").write_text(MYAPP)
        self.wal = directory / "wal"
        self.stderr_path = directory / "serve.stderr"
        command = [sys.executable, "-m", "trioq", "serve", "--wal", str(self.wal), "--host", "127.0.0.1", "--port"]
        command += ["0", "--app", "myapp:registry", "--demo-tasks", "--workers", "4", "--log-json"]
        with self.stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, cwd=directory, env=_env(TRIOQ_TOKEN=TOKEN)
            )
        match, buffer = read_until(self.process, BANNER, timeout=30)
        if match is None:
            self.stop()
            pytest.fail(f"server did not start; stdout {buffer!r}; stderr {self.stderr_path.read_text()!r}")
        self.banner, self.url, self.port = match.group(0), match.group(1), int(match.group(2))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture(scope="module")
def held(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Held]:
    server = Held(tmp_path_factory.mktemp("held"))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_the_banner_of_a_real_serve(held: Held) -> None:
    lines = held.banner.splitlines()
    assert lines[1:] == [
        "  auth: bearer token",
        f"  store: WAL {held.wal} (fsync always; replayed 0 log records)",
        "  workers: 4 in one pool for every queue",
        "  queues: default (2 tasks: cpu, sim); email (1 task: mine)",
    ], held.banner


@pytest.mark.slow
def test_a_port_in_use_is_one_line(held: Held) -> None:
    line = one_line_error(trioq_run("serve", "--memory", "--port", str(held.port)))
    assert f"127.0.0.1:{held.port} is in use" in line and "another --port" in line, line


@pytest.mark.slow
def test_a_wal_directory_another_process_holds_is_one_line(held: Held) -> None:
    line = one_line_error(trioq_run("serve", "--wal", str(held.wal), "--port", "0"))
    assert f"{held.wal} is already open (owner pid {held.process.pid})" in line, line


@pytest.mark.slow
def test_loadgen_says_when_the_token_is_wrong_or_missing_and_takes_trioq_token(held: Held) -> None:
    line = one_line_error(trioq_run("loadgen", "--url", held.url, "--token", "wrong", "--jobs", "1"))
    assert "the server refused the token" in line, line
    line = one_line_error(trioq_run("loadgen", "--url", held.url, "--jobs", "1"))
    assert "needs a bearer token: give --token or set TRIOQ_TOKEN" in line, line
    argv = ["loadgen", "--url", held.url, "--jobs", "5", "--batch", "5", "--work-ms", "1", "--timeout", "20"]
    done = trioq_run(*argv, env=_env(TRIOQ_TOKEN=TOKEN))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["done"] == 5


@pytest.mark.slow
def test_failures_reach_stderr_as_json_lines(held: Held) -> None:
    with httpx.Client(base_url=held.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as client:
        response = client.post("/jobs", json={"task": "sim", "payload": {"fail_prob": 1.0}, "max_attempts": 1})
        assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    deadline = time.monotonic() + 10
    while True:
        written = held.stderr_path.read_text()
        whole = written[: written.rfind("\n") + 1]  # a line being written is read next time
        records: list[dict[str, Any]] = [json.loads(line) for line in whole.splitlines()]  # each a JSON object
        dead = [r for r in records if r.get("job_id") == job_id and r["level"] == "ERROR"]
        if dead:
            break
        assert time.monotonic() < deadline, records
        time.sleep(0.05)
    (record,) = dead
    assert record["logger"] == "trioq" and record["task"] == "sim" and record["attempt"] == 1
    assert record["error"] == "RuntimeError: simulated failure (fail_prob=1.0)"
    assert record["message"].startswith(f"job {job_id} (sim) is dead after attempt 1")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"])
