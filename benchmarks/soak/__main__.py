"""``python -m benchmarks.soak --store postgres|wal --duration 15m --rate 50 --workers 4``.

Prints one JSON line (``section: "soak"``) and a table, appends the line to
``benchmarks/results/soak.jsonl`` unless ``--no-save``, and exits 1 when the
verdict is not clean. The run's files (the journal, ``acks.jsonl``,
``events.jsonl``, every process's log) stay in ``--out`` (default: a new
directory under the system's temporary directory).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import trio

_ROOT = Path(__file__).resolve().parent.parent.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from benchmarks._common import env_line  # noqa: E402
from benchmarks.soak import report, verdict  # noqa: E402
from benchmarks.soak.run import Settings, judge_files, soak  # noqa: E402

RESULTS = _ROOT / "benchmarks" / "results" / "soak.jsonl"


def duration(text: str) -> float:
    """``90``, ``90s``, ``15m`` or ``1h`` in seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"a duration is a number with s, m or h (15m, 90s, 1h), got {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[1])
    parser.add_argument("--store", choices=("postgres", "wal"), help="the store under test (required to run)")
    parser.add_argument("--judge", type=Path, metavar="DIR", help="judge a finished run's files again, and stop")
    parser.add_argument("--table", type=Path, metavar="JSONL", help="print the docs' table of a results file, and stop")
    parser.add_argument("--duration", type=duration, default=900.0, help="load and chaos for this long (default 15m)")
    parser.add_argument("--rate", type=float, default=50.0, help="enqueue calls per second (default 50)")
    parser.add_argument("--workers", type=int, default=4, help="trioq worker processes (postgres; default 4)")
    parser.add_argument("--slots", type=int, default=16, help="workers inside each process (default 16)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the job mix and the chaos (default 1)")
    parser.add_argument(
        "--feed",
        choices=("producer", "serve"),
        default="producer",
        help="postgres: enqueue through a producer-only queue in the harness (default), or over HTTP through a"
        " `trioq serve --postgres` that is the first worker process (its enqueues claim for its own idle workers)",
    )
    parser.add_argument("--kill-every", type=float, default=15.0, help="mean seconds between signals (default 15)")
    parser.add_argument(
        "--slow-seconds", type=float, default=20.0, help="mean length of a slow job, +-25%% (default 20)"
    )
    parser.add_argument(
        "--db-restart-every", type=float, default=240.0, help="seconds between PostgreSQL restarts (default 240)"
    )
    parser.add_argument("--lease", type=float, default=5.0, help="the PostgreSQL nodes' lease (default 5)")
    parser.add_argument("--drain-timeout", type=float, default=300.0, help="most seconds to wait for the drain")
    parser.add_argument("--dsn", help="a PostgreSQL server of your own (never restarted) instead of a throwaway one")
    parser.add_argument("--out", type=Path, help="where the run's files go (default: a new temporary directory)")
    parser.add_argument("--no-save", action="store_true", help=f"do not append the line to {RESULTS.name}")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.table is not None:
        print(report.table(args.table))
        return 0
    if args.judge is not None:
        judged, torn = judge_files(args.judge)
        print(json.dumps({**judged, "journal_torn_lines": torn}))
        print(verdict.summary_table(judged), file=sys.stderr)
        return 0 if judged["ok"] else 1
    if args.store is None:
        raise SystemExit("python -m benchmarks.soak: --store postgres|wal is required (or --judge DIR)")
    if args.rate <= 0 or args.duration <= 0 or args.workers < 1 or args.kill_every <= 0:
        raise SystemExit("python -m benchmarks.soak: --rate, --duration, --workers and --kill-every must be > 0")
    if args.out is not None and args.out.exists() and any(args.out.iterdir()):
        raise SystemExit(f"python -m benchmarks.soak: --out {args.out} is not empty (a run's files would mix)")
    out = args.out or Path(tempfile.mkdtemp(prefix=f"trioq-soak-{args.store}-"))
    settings = Settings(
        store=args.store,
        duration=args.duration,
        rate=args.rate,
        workers=args.workers,
        slots=args.slots,
        seed=args.seed,
        feed=args.feed,
        kill_every=args.kill_every,
        slow_seconds=args.slow_seconds,
        db_restart_every=args.db_restart_every,
        lease=args.lease,
        drain_timeout=args.drain_timeout,
        dsn=args.dsn,
        out=out,
    )
    print(json.dumps(env_line(False, store=args.store)), flush=True)
    print(f"[soak] {args.store} for {args.duration:.0f} s; files in {out}", file=sys.stderr, flush=True)
    line = trio.run(soak, settings)
    line["date"] = time.strftime("%Y-%m-%d")
    text = json.dumps(line)
    print(text, flush=True)
    print(verdict.summary_table(line["verdict"]), file=sys.stderr)
    if not args.no_save:
        with RESULTS.open("a") as file:
            file.write(text + "\n")
    processes = line["processes"]
    clean = bool(line["verdict"]["ok"]) and line["drained"] and not line["journal_torn_lines"]
    clean = clean and not processes["unexpected_exits"] and set(processes["final_exit_codes"]) <= {0}
    clean = clean and set(processes["sigterm_exit_codes"]) <= {0} and _store_clean(line)
    return 0 if clean else 1


def _store_clean(line: dict[str, object]) -> bool:
    checks = line["store_checks"]
    assert isinstance(checks, dict)
    if "exit" in checks:
        return bool(checks["exit"] == 0)
    return all(value == 0 for value in checks.values())


if __name__ == "__main__":
    sys.exit(main())
