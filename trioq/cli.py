"""The ``trioq`` command line: ``trioq demo`` for now; ``serve``, ``loadgen`` and
``wal`` arrive with the WAL store and the HTTP service."""

from __future__ import annotations

import argparse
import sys
import time

import trio

from ._model import JobSpec
from ._registry import Registry
from ._runtime import open_queue

__all__ = ["main"]


async def _demo(jobs: int, workers: int) -> None:
    registry = Registry()
    attempts: dict[int, int] = {}

    @registry.task(max_attempts=5)
    async def flaky(ctx: object, n: int) -> int:
        attempts[n] = attempts.get(n, 0) + 1
        await trio.sleep(0.002)
        if n % 5 == 0 and attempts[n] == 1:
            raise RuntimeError(f"job {n} fails on its first attempt")
        return n * n

    started = time.perf_counter()
    async with open_queue(registry, workers=workers) as queue:
        await queue.enqueue_many([JobSpec("flaky", {"n": n}) for n in range(jobs)])
        await queue.join()
        stats = await queue.stats()
    elapsed = time.perf_counter() - started
    counts, totals = stats["jobs"], stats["totals"]
    print("trioq demo (in memory; the HTTP service and kill -9 recovery demo arrive with `trioq serve`)")
    print(f"  jobs enqueued      {totals['enqueued']:>8}")
    print(f"  succeeded          {counts['succeeded']:>8}")
    print(f"  dead               {counts['dead']:>8}")
    print(f"  failed attempts    {totals['failed_attempts']:>8}  (every 5th job fails once, then retries)")
    print(f"  workers            {workers:>8}")
    print(f"  wall time          {elapsed:>8.2f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trioq", description="A job runtime for trio applications.")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a short demonstration")
    demo.add_argument("--jobs", type=int, default=500)
    demo.add_argument("--workers", type=int, default=16)
    wal = commands.add_parser("wal", help="look at a WAL directory").add_subparsers(dest="wal_command", required=True)
    verify = wal.add_parser("verify", help="check every segment; exit 0 if the log replays cleanly")
    verify.add_argument("directory")
    inspect = wal.add_parser("inspect", help="job counts per state, segments and sizes, last checkpoint")
    inspect.add_argument("directory")
    args = parser.parse_args(argv)
    if args.command == "demo":
        trio.run(_demo, args.jobs, args.workers)
    elif args.command == "wal":
        from ._walcli import inspect_command, verify_command

        command = verify_command if args.wal_command == "verify" else inspect_command
        return command(args.directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
