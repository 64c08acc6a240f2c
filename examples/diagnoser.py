"""An async diagnostics service: POST a target and a list of checks, poll for the report.

    python examples/diagnoser.py [--port 8000] [--data ./diagnoser-data] [--token T]

    curl -s localhost:8000/jobs -d '{"task": "diagnose",
        "payload": {"target": "example.com", "checks": ["dns", "tcp", "http", "slow"]}}'
    curl -s localhost:8000/jobs/<id>      # "result": [{"check": "dns", "status": "ok", ...}, ...]

One job runs all its checks at once, each under its own deadline: a check that
does not answer within ``timeout_s`` reports ``"timeout"`` and the others are not
held up, so a report takes about the slowest check (at most ``timeout_s``), not
the sum. The results come back in the order the checks were asked for.

The queue is bounded (``--max-ready``): an overloaded service answers 503 with
``Retry-After`` instead of queueing without limit. Jobs live in a WALStore, and
SIGTERM / Ctrl-C shuts down gracefully: HTTP stops, running diagnoses get a few
seconds to finish, and any still running go back to ``ready`` (the cut-off attempt
is not counted) to run again after a restart. No job is left in limbo.
"""

from __future__ import annotations

import argparse
import functools
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

import trioq
from trioq.http import create_app

__all__ = ["CHECKS", "build", "main", "registry", "run"]


async def _simulate(seconds: float, detail: str) -> str:
    await trio.sleep(seconds)  # stands in for real network or disk I/O
    return detail


async def check_dns(target: str) -> str:
    if target.endswith(".invalid"):  # RFC 2606: never resolves
        await trio.sleep(0.05)
        raise LookupError(f"NXDOMAIN for {target}")
    return await _simulate(0.05, f"{target} resolves to 192.0.2.10")


async def check_tcp(target: str) -> str:
    return await _simulate(0.1, f"{target}:443 accepts connections")


async def check_http(target: str) -> str:
    return await _simulate(0.3, f"GET https://{target}/ answered 200")


async def check_disk(target: str) -> str:
    return await _simulate(0.02, "/var is 42% full")


async def check_slow(target: str) -> str:
    return await _simulate(3600.0, "a check that never answers in time")


#: The built-in checks by name. Each is deterministic: the same check always takes
#: the same (simulated) time. A check returns a detail string or raises.
CHECKS: dict[str, Callable[[str], Awaitable[str]]] = {
    "dns": check_dns,
    "tcp": check_tcp,
    "http": check_http,
    "disk": check_disk,
    "slow": check_slow,
}

registry = trioq.Registry()


# One attempt: a report of failed checks is a result, not an error to retry.
@registry.task(max_attempts=1)
async def diagnose(
    ctx: trioq.JobContext, target: str, checks: list[str], timeout_s: float = 1.0
) -> list[dict[str, str]]:
    """Run ``checks`` against ``target`` concurrently; one ``{"check", "status", "detail"}`` each.

    ``status`` is ``"ok"``, ``"fail"`` (the check raised), ``"timeout"`` (no answer
    within ``timeout_s`` seconds) or ``"unknown"`` (no such check).
    """
    if not isinstance(target, str) or not target:
        raise ValueError("target must be a non-empty string")
    if not isinstance(checks, list) or not all(isinstance(name, str) for name in checks):
        raise ValueError("checks must be a list of check names")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not timeout_s > 0:
        raise ValueError("timeout_s must be a positive number of seconds")

    results: list[dict[str, str]] = [{} for _ in checks]

    async def run_one(index: int, name: str) -> None:
        check = CHECKS.get(name)
        if check is None:
            results[index] = {"check": name, "status": "unknown", "detail": f"choose from {sorted(CHECKS)}"}
            return
        result = {"check": name, "status": "timeout", "detail": f"no answer within {timeout_s:g}s"}
        with trio.move_on_after(timeout_s):  # this check's own deadline
            try:
                result = {"check": name, "status": "ok", "detail": await check(target)}
            except Exception as exc:
                result = {"check": name, "status": "fail", "detail": f"{type(exc).__name__}: {exc}"}
        results[index] = result

    async with trio.open_nursery() as nursery:
        for index, name in enumerate(checks):
            nursery.start_soon(run_one, index, name)
    return results


def build(queue: trioq.Queue, *, token: str | None = None) -> QuartTrio:
    """The HTTP app for ``queue``: trioq's routes plus ``GET /checks``."""
    app = create_app(queue, token=token)

    @app.get("/checks")
    async def list_checks() -> dict[str, Any]:
        return {"checks": sorted(CHECKS)}

    return app


async def _stop_on_signal(stop: trio.Event, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            print(f"{signal.Signals(signum).name}: shutting down (again to force)", flush=True)
            stop.set()
            return  # the receiver closes: a second Ctrl-C raises KeyboardInterrupt


async def run(port: int, data: str, *, workers: int, max_ready: int, token: str | None) -> None:
    """Serve the diagnoser on 127.0.0.1:``port`` until SIGTERM or SIGINT."""
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    stop = trio.Event()
    store = trioq.WALStore(data, fsync="always")
    async with (
        trioq.open_queue(registry, store=store, workers=workers, max_ready=max_ready, shutdown_grace=3.0) as queue,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(_stop_on_signal, stop)
        print(f"diagnoser on http://127.0.0.1:{port} (jobs in {data})", flush=True)
        await serve(build(queue, token=token), config, shutdown_trigger=stop.wait)
        nursery.cancel_scope.cancel()
    # Leaving open_queue drained the workers: every job is finished or back to ready.


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An async diagnostics service on trioq.")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--data", default="./diagnoser-data", help="WAL directory (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=8, help="diagnoses run at once")
    parser.add_argument("--max-ready", type=int, default=100, help="waiting diagnoses before 503")
    parser.add_argument("--token", default=None, help="require Authorization: Bearer TOKEN")
    args = parser.parse_args(argv)
    serve_it = functools.partial(run, workers=args.workers, max_ready=args.max_ready, token=args.token)
    trio.run(serve_it, args.port, args.data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
