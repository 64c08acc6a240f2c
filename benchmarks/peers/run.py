"""trioq beside arq, SAQ, taskiq, Dramatiq and Procrastinate: same workloads, one run.

Run from the repository root, after ``bash benchmarks/peers/setup.sh``::

    python benchmarks/peers/run.py                      # 3 rounds, about 15 minutes
    python benchmarks/peers/run.py --rounds 1 --libs trioq,saq --markdown /tmp/peers.md
    python benchmarks/peers/run.py --libs trioq,procrastinate --variants postgres,wal-always

Each measurement is one process (``adapters/lib_<name>.py``, see ``common.py``
for the workloads), run with the library's own interpreter: trioq's with this
Python, the peers' with the venv that ``setup.sh`` made. Rounds interleave the
libraries (every library runs a workload, then the next workload; then the next
round), so a slow minute of the machine touches every library alike.

stdout: JSON lines (an ``env`` line, one line per measurement with its round,
then one ``summary`` line per library and variant with medians and min-max,
then the ``targets`` line). stderr: progress, and the markdown table of medians
(also written to ``--markdown FILE``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ADAPTERS = HERE / "adapters"
PEERS_DIR = Path(os.environ.get("PEERS_DIR", "/tmp/trioq-peers"))

#: (library, variant, note shown in the table)
ENTRIES: list[tuple[str, str, str]] = [
    ("trioq", "memory", "embedded, MemoryStore"),
    ("trioq", "wal-never", "embedded, WALStore fsync=never"),
    ("trioq", "wal-always", "embedded, WALStore fsync=always (durable enqueue)"),
    (
        "trioq",
        "postgres",
        "PostgreSQL; PostgresStore defaults, one node (producer and workers in one process; a local enqueue "
        "wakes the workers without NOTIFY); drain timed from before open_queue",
    ),
    ("arq", "default", "Redis; defaults (poll_delay 0.5 s)"),
    ("arq", "tuned", "Redis; poll_delay 0.005 s"),
    ("saq", "default", "Redis; defaults"),
    ("taskiq", "default", "Redis; defaults"),
    ("dramatiq", "default", "Redis; 1 process x N threads"),
    ("procrastinate", "default", "PostgreSQL; defaults (LISTEN/NOTIFY)"),
]
#: (workload, extra arguments, key in the tables)
WORKLOADS: list[tuple[str, list[str], str]] = [
    ("noop", [], "noop"),
    ("latency", [], "latency"),
    ("sleep", ["--concurrency", "16"], "sleep16"),
    ("sleep", ["--concurrency", "64"], "sleep64"),
]
PEER_PACKAGES = ["arq", "saq", "taskiq", "taskiq-redis", "dramatiq", "procrastinate", "psycopg", "redis"]


def load_env() -> dict[str, str]:
    """The environment for adapters: ours plus what setup.sh wrote to env.sh."""
    env = dict(os.environ)
    env_file = PEERS_DIR / "env.sh"
    if env_file.exists():
        for line in env_file.read_text().splitlines():
            if line.startswith("export ") and "=" in line:
                name, value = line.removeprefix("export ").split("=", 1)
                env.setdefault(name, value)
    return env


def interpreter(lib: str, env: dict[str, str]) -> str:
    if lib == "trioq":
        return sys.executable
    python = env.get("PEERS_PYTHON", str(PEERS_DIR / "venv" / "bin" / "python"))
    if not Path(python).exists():
        sys.exit(f"no peers venv at {python}: run `bash benchmarks/peers/setup.sh` first")
    return python


def emit(line: dict[str, Any]) -> None:
    print(json.dumps(line), flush=True)


def log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


def env_line(env: dict[str, str], quick: bool) -> dict[str, Any]:
    versions: dict[str, str] = {}
    probe = (
        "import json, importlib.metadata as m\nout = {}\n"
        f"for p in {PEER_PACKAGES!r}:\n"
        "    try: out[p] = m.version(p)\n    except Exception: pass\nprint(json.dumps(out))"
    )
    try:
        peers = subprocess.run([interpreter("arq", env), "-c", probe], capture_output=True, text=True, timeout=60)
        versions.update(json.loads(peers.stdout))
    except (OSError, ValueError, subprocess.SubprocessError, SystemExit) as exc:
        log(f"could not read the peers' versions: {exc}")
    import importlib.metadata as metadata

    versions["trioq"] = metadata.version("trioq")
    versions["trio"] = metadata.version("trio")
    return {
        "section": "env",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "versions": versions,
        "quick": quick,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_one(
    lib: str, variant: str, workload: str, extra: list[str], env: dict[str, str], quick: bool
) -> dict[str, Any]:
    command = [interpreter(lib, env), str(ADAPTERS / f"lib_{lib}.py"), workload, "--variant", variant, *extra]
    if quick:
        command += ["--jobs", {"noop": "1000", "latency": "50", "sleep": "200"}[workload]]
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=HERE.parents[1])
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 600 s", "command": shlex.join(command)}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-5:]
        return {"error": f"exit {proc.returncode}", "stderr": tail, "command": shlex.join(command)}
    answer: dict[str, Any] = json.loads(lines[-1])
    answer["wall_s"] = round(time.perf_counter() - started, 2)
    return answer


def figures(key: str, line: dict[str, Any]) -> dict[str, float]:
    """The figures of one measurement, named for the tables."""
    if key == "noop":
        return {"drain_per_s": line["drain_per_s"], "enqueue_per_s": line["enqueue_per_s"]}
    if key == "latency":
        return {"p50_ms": line["p50_ms"], "p99_ms": line["p99_ms"]}
    return {f"{key}_efficiency": line["efficiency"]}


def summarize(samples: dict[tuple[str, str], dict[str, list[float]]]) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for entry, by_figure in samples.items():
        out[entry] = {
            name: {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
            for name, values in by_figure.items()
        }
    return out


def select(entries: list[tuple[str, str, str]], libs: str | None, variants: str | None) -> list[tuple[str, str, str]]:
    """The entries of ``--libs`` and ``--variants``.

    ``--variants`` is comma-separated: ``NAME`` picks that variant of every library
    that has one so named, ``LIB:NAME`` that of one library; a library none of whose
    variants is named keeps them all (``--variants postgres,wal-always`` picks two of
    trioq's and leaves Procrastinate's ``default``).
    """
    wanted = set(libs.split(",")) if libs else None
    chosen = [e for e in entries if wanted is None or e[0] in wanted]
    if not variants:
        return chosen
    names = {v.strip() for v in variants.split(",") if v.strip()}
    known = {variant for _, variant, _ in entries} | {f"{lib}:{variant}" for lib, variant, _ in entries}
    if unknown := names - known:
        sys.exit(f"unknown variant(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")

    def named(lib: str, variant: str) -> bool:
        return variant in names or f"{lib}:{variant}" in names

    narrowed = {lib for lib, variant, _ in chosen if named(lib, variant)}
    return [e for e in chosen if e[0] not in narrowed or named(e[0], e[1])]


def targets(summary: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets: WAL-always drain >= 8x best peer, p50 >= 5x lower, sleep efficiency above all;
    PostgresStore's drain >= 40x Procrastinate's and its p50 lower than Procrastinate's."""

    def med(entry: tuple[str, str], name: str) -> float | None:
        figure = summary.get(entry, {}).get(name)
        return None if figure is None else figure["median"]

    peers = [entry for entry in summary if entry[0] != "trioq"]
    line: dict[str, Any] = {"section": "targets"}
    best_drain = max((med(p, "drain_per_s") or 0.0 for p in peers), default=0.0)
    wal = med(("trioq", "wal-always"), "drain_per_s")
    if wal is not None and best_drain:
        line["wal_always_drain_vs_best_peer"] = round(wal / best_drain, 2)
        line["drain_target_met"] = wal / best_drain >= 8.0
    peer_p50 = [v for p in peers if (v := med(p, "p50_ms")) is not None]
    if peer_p50:
        best_p50 = min(peer_p50)
        for variant in ("memory", "wal-never", "wal-always", "postgres"):
            ours = med(("trioq", variant), "p50_ms")
            if ours:
                line[f"p50_{variant}_times_lower_than_best_peer"] = round(best_p50 / ours, 1)
        ours = med(("trioq", "wal-always"), "p50_ms")
        if ours is not None:
            line["latency_target_met"] = bool(ours) and best_p50 / ours >= 5.0
    for key in ("sleep16_efficiency", "sleep64_efficiency"):
        best_peer = max((v for p in peers if (v := med(p, key)) is not None), default=None)
        ours = [v for variant in ("memory", "wal-never", "wal-always") if (v := med(("trioq", variant), key))]
        if best_peer is not None and ours:
            line[f"{key}_best_peer"] = best_peer
            line[f"{key}_trioq_min"] = min(ours)
            line[f"{key}_target_met"] = min(ours) > best_peer
    # PostgresStore against the other queue on PostgreSQL.
    pg, proc = ("trioq", "postgres"), ("procrastinate", "default")
    pg_drain, proc_drain = med(pg, "drain_per_s"), med(proc, "drain_per_s")
    if pg_drain is not None and proc_drain:
        line["postgres_drain_vs_procrastinate"] = round(pg_drain / proc_drain, 2)
        line["postgres_drain_target_met"] = pg_drain / proc_drain >= 40.0
    pg_p50, proc_p50 = med(pg, "p50_ms"), med(proc, "p50_ms")
    if pg_p50 is not None and proc_p50 is not None:
        line["postgres_p50_ms"], line["procrastinate_p50_ms"] = pg_p50, proc_p50
        line["postgres_p50_times_lower_than_procrastinate"] = round(proc_p50 / pg_p50, 2) if pg_p50 else None
        line["postgres_latency_target_met"] = pg_p50 < proc_p50
    return line


def cell(figure: dict[str, Any] | None, digits: int = 0) -> str:
    if figure is None:
        return "-"
    fmt = f"{{:,.{digits}f}}"
    return f"{fmt.format(figure['median'])} ({fmt.format(figure['min'])}-{fmt.format(figure['max'])})"


def markdown(summary: dict[tuple[str, str], dict[str, Any]], rounds: int) -> str:
    notes = {(lib, variant): note for lib, variant, note in ENTRIES}
    lines = [
        f"Medians of {rounds} round(s), (min-max) beside them.",
        "",
        "| library | setup | no-op drain jobs/s | enqueue jobs/s | latency p50 ms | latency p99 ms "
        "| sleep eff. @16 | sleep eff. @64 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for entry, figs in summary.items():
        lines.append(
            f"| {entry[0]} {entry[1]} | {notes.get(entry, '')} | {cell(figs.get('drain_per_s'))} "
            f"| {cell(figs.get('enqueue_per_s'))} | {cell(figs.get('p50_ms'), 2)} | {cell(figs.get('p99_ms'), 2)} "
            f"| {cell(figs.get('sleep16_efficiency'), 3)} | {cell(figs.get('sleep64_efficiency'), 3)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--libs", help="comma-separated subset, e.g. trioq,saq")
    parser.add_argument(
        "--variants",
        help="comma-separated variants (NAME or LIB:NAME), e.g. postgres,wal-always; "
        "a library with none named keeps all of its own",
    )
    parser.add_argument("--quick", action="store_true", help="a tenth of the jobs: checks the harness only")
    parser.add_argument("--markdown", type=Path, help="also write the markdown table here")
    args = parser.parse_args()
    entries = select(ENTRIES, args.libs, args.variants)
    if not entries:
        sys.exit("no library or variant selected")
    env = load_env()
    emit(env_line(env, args.quick))
    samples: dict[tuple[str, str], dict[str, list[float]]] = {(lib, variant): {} for lib, variant, _ in entries}
    for round_no in range(1, args.rounds + 1):
        for workload, extra, key in WORKLOADS:
            # Alternate the order each round (A B C, then C B A) so no library always runs first.
            order = entries if round_no % 2 else list(reversed(entries))
            for lib, variant, _ in order:
                line = run_one(lib, variant, workload, extra, env, args.quick)
                line.update({"section": "peers", "round": round_no, "key": key, "lib": lib, "variant": variant})
                emit(line)
                if "error" in line:
                    log(f"round {round_no} {key} {lib} {variant}: FAILED {line['error']} {line.get('stderr', '')}")
                    continue
                for name, value in figures(key, line).items():
                    samples[(lib, variant)].setdefault(name, []).append(value)
                log(f"round {round_no} {key} {lib} {variant}: {figures(key, line)}")
    summary = summarize(samples)
    for (lib, variant), figs in summary.items():
        emit({"section": "summary", "lib": lib, "variant": variant, **figs})
    emit(targets(summary))
    table = markdown(summary, args.rounds)
    print(table, file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
