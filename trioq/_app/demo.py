"""``trioq demo``: a real server, real failures and hangs, and a kill -9 in the middle.

Starts ``trioq serve`` on a free local port with a temporary WAL, drives it with
the load generator (20% failing attempts, 1% hangs), kills the server with
SIGKILL mid-run, restarts it on the same directory, and checks that every job
the server acknowledged finished.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import trio

from .loadgen import LoadResult, fetch_jobs, sim_jobs, submit, wait_drained

__all__ = ["demo"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_server(directory: str, port: int) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "trioq", "serve", "--wal", directory, "--port", str(port),
        "--workers", "64", "--heartbeat-timeout", "0.5", "--shutdown-grace", "1",
    ]  # fmt: skip
    # Its own server, on loopback, without a token: not the caller's TRIOQ_TOKEN
    # (the demo's client sends none; an empty one would be refused).
    env = {name: value for name, value in os.environ.items() if name != "TRIOQ_TOKEN"}
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


async def _wait_healthy(client: httpx.AsyncClient, timeout: float) -> None:
    with trio.fail_after(timeout):
        while True:
            try:
                if (await client.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.05)


async def run_demo(jobs: int = 2000, *, out: Any = sys.stdout) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="trioq-demo-")
    port = _free_port()
    server = _start_server(directory, port)
    result = LoadResult()
    started = time.perf_counter()
    killed_at_acked = 0
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
            await _wait_healthy(client, 30)
            print(f"server up on 127.0.0.1:{port} (WAL in {directory}); submitting {jobs} jobs", file=out)

            async def kill_mid_run() -> None:
                nonlocal server, killed_at_acked
                while len(result.acked) < jobs // 2:  # noqa: ASYNC110 - a counter the submitters bump
                    await trio.sleep(0.01)
                killed_at_acked = len(result.acked)
                server.send_signal(signal.SIGKILL)
                await trio.to_thread.run_sync(server.wait)
                print(f"kill -9 after {killed_at_acked} acknowledged jobs; restarting", file=out)
                server = _start_server(directory, port)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill_mid_run)
                load = sim_jobs(jobs, work_ms=20, fail_prob=0.2, hang_prob=0.01)
                await submit(client, load, clients=8, batch=25, result=result, deadline=trio.current_time() + 60)
            await _wait_healthy(client, 30)
            stats = await wait_drained(client, timeout=60)
            found = await fetch_jobs(client, list(result.acked), clients=8)
        server.send_signal(signal.SIGTERM)
        exit_code = await trio.to_thread.run_sync(server.wait, 30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        shutil.rmtree(directory, ignore_errors=True)
    states: dict[str, int] = {}
    for job in found.values():
        state = "missing" if job is None else job["state"]
        states[state] = states.get(state, 0) + 1
    unfinished = sum(n for state, n in states.items() if state not in ("succeeded", "dead"))
    totals = stats["totals"]
    return {
        "acknowledged": len(result.acked),
        "killed_after": killed_at_acked,
        "states": states,
        "unfinished": unfinished,
        "retried_after_restart": totals["retried"],
        "hangs_caught_after_restart": totals["hung"] + totals["timed_out"],
        "refused_503": result.refused,
        "retries_while_down": result.unreachable,
        "server_exit_code": exit_code,
        "seconds": round(time.perf_counter() - started, 1),
    }


def demo(jobs: int) -> int:
    report = trio.run(run_demo, jobs)
    rows = [
        ("jobs acknowledged by the server", report["acknowledged"]),
        ("server killed with SIGKILL after", report["killed_after"]),
        ("succeeded", report["states"].get("succeeded", 0)),
        ("dead (failed all 5 attempts)", report["states"].get("dead", 0)),
        ("acknowledged but unfinished (must be 0)", report["unfinished"]),
        ("retries after restart (20% failures)", report["retried_after_restart"]),
        ("hangs caught after restart (1% hangs)", report["hangs_caught_after_restart"]),
        ("submissions retried while the server was down", report["retries_while_down"]),
        ("server exit code after SIGTERM", report["server_exit_code"]),
        ("wall time, seconds", report["seconds"]),
    ]
    width = max(len(name) for name, _ in rows)
    print()
    for name, value in rows:
        print(f"  {name:<{width}}  {value:>8}")
    ok = report["unfinished"] == 0 and report["server_exit_code"] == 0
    print("\n  every acknowledged job finished" if ok else "\n  SOMETHING WAS LOST: see above")
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(demo(int(os.environ.get("TRIOQ_DEMO_JOBS", "2000"))))
