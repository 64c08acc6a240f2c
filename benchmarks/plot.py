"""Plot the benchmark JSON lines in ``benchmarks/results/*.jsonl`` as PNGs in ``docs/img/``.

Run from the repository root after the benchmarks::

    python benchmarks/plot.py                     # every results file it knows how to plot
    python benchmarks/plot.py --results DIR --out DIR

matplotlib is not a trioq dependency; install it yourself (``pip install
matplotlib``). Figures written (each only if its data is there):

``seed_orchd_throughput.png``
    orchd experiment A: throughput against workers for trioq over HTTP, the bare
    trio memory channel measured in the same run, the ideal ``workers / 0.020``,
    orchd's published points and, if ``core.jsonl`` has them, trioq in-process.
``seed_orchd_reliability.png``
    orchd experiments B and C: completion % with the feature off and on, and
    the time each took.
``peers.png``
    ``peers.jsonl``: no-op drain rate and start latency p50 per library (log
    scales, medians with min-max bars), and sleep-bound efficiency at 16 and 64.
``cpu.png``
    ``cpu.jsonl``: jobs/s of process handlers against workers, with the ideal.
``scale.png``
    ``scale.jsonl``: enqueue, drain and recovery rates against jobs held.
``overload.png``
    ``overload.jsonl``: on time % per arm of each profile (median, min-max over the seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parent.parent


def load(results: Path) -> dict[str, list[dict[str, Any]]]:
    """Every results file's JSON lines, by file stem (lines that do not parse are skipped)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(results.glob("*.jsonl")):
        lines = []
        for raw in path.read_text().splitlines():
            raw = raw.strip()
            if not raw:
                continue
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                print(f"plot: skipping a line of {path.name} that is not JSON", file=sys.stderr)
        out[path.stem] = lines
    return out


def save(plt: Any, fig: Any, path: Path, dpi: int = 120) -> Path:
    """Lay out ``fig``, write it to ``path`` as a PNG, close it; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_throughput(plt: Any, data: dict[str, list[dict[str, Any]]], out: Path) -> Path | None:
    rows = sorted(
        (r for r in data.get("seed_orchd", []) if r.get("section") == "throughput"), key=lambda r: r["workers"]
    )
    if not rows:
        return None
    workers = [r["workers"] for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.plot(workers, [r["ideal_jobs_per_s"] for r in rows], ":", color="grey", label="ideal (workers / 20 ms)")
    ax.plot(
        workers,
        [r["bare_channel_jobs_per_s"] for r in rows],
        "s--",
        color="tab:green",
        label="bare trio memory channel (same run)",
    )
    ax.plot(
        workers,
        [r["trioq_http_jobs_per_s"] for r in rows],
        "o-",
        color="tab:blue",
        label="trioq serve over HTTP (WAL, fsync always)",
    )
    for r in rows:
        ax.annotate(
            f"{r['trioq_http_jobs_per_s']:,.0f}\n({r['ratio']:.2f}x bare)",
            (r["workers"], r["trioq_http_jobs_per_s"]),
            textcoords="offset points",
            xytext=(8, -22),
            fontsize=8,
            color="tab:blue",
        )
    core = [r for r in data.get("core", []) if r.get("section") == "sleep_bound"]
    if core:
        core.sort(key=lambda r: r["workers"])
        ax.plot(
            [r["workers"] for r in core],
            [r["trioq_jobs_per_s"] for r in core],
            "^",
            color="tab:purple",
            markersize=9,
            zorder=5,
            label="trioq in-process, MemoryStore (core.py)",
        )
    orchd = sorted({(r["workers"], r["orchd_jobs_per_s"]) for r in rows if "orchd_jobs_per_s" in r})
    if orchd:
        ax.plot(
            [w for w, _ in orchd],
            [v for _, v in orchd],
            "X",
            markersize=11,
            color="tab:red",
            linestyle="none",
            label="orchd (published)",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(workers)
    ax.set_xticklabels([str(w) for w in workers])
    ax.set_xlabel("workers")
    ax.set_ylabel("jobs/s (log)")
    ax.set_title("orchd experiment A: sim jobs of 20 ms, throughput vs workers")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return save(plt, fig, out / "seed_orchd_throughput.png")


def plot_reliability(plt: Any, data: dict[str, list[dict[str, Any]]], out: Path) -> Path | None:
    rows = {(r["section"], r["arm"]): r for r in data.get("seed_orchd", []) if r.get("section") in ("retries", "hangs")}
    if not rows:
        return None
    panels = [
        ("retries", "B: 20% failures\nretries off / on (5 attempts)", 99.9),
        ("hangs", "C: 1% hangs\nheartbeat off / on (0.2 s)", 100.0),
    ]
    panels = [p for p in panels if any(k[0] == p[0] for k in rows)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.5), squeeze=False)
    for ax, (section, title, target) in zip(axes[0], panels, strict=True):
        arms = [a for a in ("off", "on") if (section, a) in rows]
        values = [rows[(section, a)]["completion_pct_median"] for a in arms]
        bars = ax.bar(arms, values, color=["tab:grey" if a == "off" else "tab:blue" for a in arms])
        for bar, arm in zip(bars, arms, strict=True):
            r = rows[(section, arm)]
            when = f"{r['time_s_median']:.2f} s" if all(r["drained_rounds"]) else f"cut at {r['time_s_median']:.0f} s"
            ax.annotate(
                f"{r['completion_pct_median']:g}%\n{when}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=9,
                xytext=(0, 3),
                textcoords="offset points",
            )
        ax.axhline(target, color="tab:red", linestyle="--", linewidth=1, label=f"target (on) {target:g}%")
        low = min([*values, target])
        ax.set_ylim(max(0.0, low - 10), 100 + 0.12 * (100 - max(0.0, low - 10)))
        ax.set_ylabel("completion % (median of rounds)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("orchd experiments B and C over HTTP (trioq serve, WAL fsync always)", fontsize=11)
    return save(plt, fig, out / "seed_orchd_reliability.png")


def plot_peers(plt: Any, data: dict[str, list[dict[str, Any]]], out: Path) -> Path | None:
    rows = [r for r in data.get("peers", []) if r.get("section") == "summary"]
    if not rows:
        return None
    names = [f"{r['lib']}\n{r['variant']}" for r in rows]
    colors = ["tab:blue" if r["lib"] == "trioq" else "tab:grey" for r in rows]
    panels = [
        ("drain_per_s", "no-op drain, jobs/s (log)", True),
        ("p50_ms", "start latency p50, ms (log; lower is better)", True),
        ("sleep16_efficiency", "sleep-bound efficiency @16", False),
        ("sleep64_efficiency", "sleep-bound efficiency @64", False),
    ]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    for ax, (key, title, log_scale) in zip(axes.flat, panels, strict=True):
        med = [r.get(key, {}).get("median", 0.0) for r in rows]
        low = [m - r.get(key, {}).get("min", m) for m, r in zip(med, rows, strict=True)]
        high = [r.get(key, {}).get("max", m) - m for m, r in zip(med, rows, strict=True)]
        ax.bar(range(len(rows)), med, color=colors, yerr=[low, high], capsize=3)
        ax.set_xticks(range(len(rows)), names, fontsize=7)
        if log_scale:
            ax.set_yscale("log")
        for i, m in enumerate(med):
            ax.annotate(
                f"{m:,.0f}" if m >= 100 else f"{m:.3g}",
                (i, m),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
        ax.set_title(title, fontsize=10)
    fig.suptitle("trioq (blue, embedded) beside networked peers (grey), same machine, same run", fontsize=11)
    return save(plt, fig, out / "peers.png", dpi=110)


def plot_cpu(plt: Any, data: dict[str, list[dict[str, Any]]], out: Path) -> Path | None:
    rows = sorted((r for r in data.get("cpu", []) if r.get("section") == "scaling"), key=lambda r: r["workers"])
    if not rows:
        return None
    workers = [r["workers"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.plot(
        workers, [r["ideal_jobs_per_s"] for r in rows], ":", color="grey", label="ideal: min(workers, CPUs) / serial"
    )
    ax.plot(workers, [r["jobs_per_s"] for r in rows], "o-", color="tab:blue", label='trioq, kind="process"')
    orchd = {1: 20.7, 2: 37.7, 4: 39.1, 16: 14.4}
    ax.plot(list(orchd), list(orchd.values()), "x--", color="tab:red", label="orchd (published)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(workers, [str(w) for w in workers])
    ax.set_xlabel("workers")
    ax.set_ylabel("jobs/s (chained SHA-256)")
    ax.legend(fontsize=8)
    ax.set_title("CPU-bound jobs on process handlers", fontsize=10)
    return save(plt, fig, out / "cpu.png")


def plot_scale(plt: Any, data: dict[str, list[dict[str, Any]]], out: Path) -> Path | None:
    rows = [r for r in data.get("scale", []) if r.get("section") == "scale"]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for store, style in (("memory", "o-"), ("wal-always", "s--")):
        mine = sorted((r for r in rows if r["store"] == store), key=lambda r: r["jobs"])
        n = [r["jobs"] for r in mine]
        for key, color in (
            ("enqueue_per_s", "tab:blue"),
            ("drain_per_s", "tab:green"),
            ("recovery_records_per_s", "tab:purple"),
        ):
            if all(key in r for r in mine):
                axes[0].plot(
                    n, [r[key] for r in mine], style, color=color, label=f"{key.removesuffix('_per_s')} ({store})"
                )
        axes[1].plot(n, [r["rss_per_job_bytes"] for r in mine], style, label=f"RSS per job ({store})")
        if all("wal_bytes_per_job" in r for r in mine):
            axes[1].plot(n, [r["wal_bytes_per_job"] for r in mine], style, label="WAL bytes per job")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("jobs held")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("per second")
    axes[1].set_ylabel("bytes per job")
    fig.suptitle("How trioq's costs grow with the number of jobs", fontsize=11)
    return save(plt, fig, out / "scale.png")


def plot_overload(plt: Any, data: dict[str, list[dict[str, Any]]], out: Path) -> Path | None:
    """``overload.jsonl``: on time % per arm (median, min-max bars over the seeds), one panel per
    profile but the first (every arm 100 % there); the last line of each profile and arm counts."""
    arms: dict[int, dict[str, dict[str, Any]]] = {}
    names: dict[int, str] = {}
    for r in data.get("overload", []):
        if r.get("section") == "overload":
            arms.setdefault(r["profile"], {})[r["arm"]] = r
            names[r["profile"]] = r.get("profile_name", "")
    profiles = [n for n in sorted(arms) if n != 1]
    if not profiles:
        return None
    cols = 2
    rows = (len(profiles) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.8 * rows), squeeze=False)
    for ax, number in zip([a for row in axes for a in row], profiles, strict=False):
        lines = list(arms[number].values())
        labels = [r["arm"] for r in lines]
        median = [r["on_time_pct"]["median"] for r in lines]
        low = [m - r["on_time_pct"]["min"] for m, r in zip(median, lines, strict=True)]
        high = [r["on_time_pct"]["max"] - m for m, r in zip(median, lines, strict=True)]
        colours = ["tab:grey" if label in ("fifo", "defer") else "tab:blue" for label in labels]
        ax.barh(range(len(lines)), median, xerr=[low, high], color=colours, capsize=3)
        for y, (m, r) in enumerate(zip(median, lines, strict=True)):
            ax.annotate(
                f"{m:.1f}", (r["on_time_pct"]["max"], y), textcoords="offset points", xytext=(5, -3), fontsize=7
            )
        ax.set_yticks(range(len(lines)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 110)
        ax.set_title(f"profile {number}: {names[number]}", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    for ax in [a for row in axes for a in row][len(profiles) :]:
        ax.set_visible(False)
    fig.suptitle(
        "overload benchmark: % of offered tasks done within 500 ms (median, min-max over 5 seeds)", fontsize=10
    )
    return save(plt, fig, out / "overload.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=_ROOT / "benchmarks" / "results")
    parser.add_argument("--out", type=Path, default=_ROOT / "docs" / "img")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "plot.py needs matplotlib, which is not a trioq dependency: install it with "
            "`pip install matplotlib` (e.g. `.venv/bin/pip install matplotlib`) and run again.",
            file=sys.stderr,
        )
        return 2
    data = load(args.results)
    if not data:
        print(f"plot: no *.jsonl files in {args.results}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    plots = (plot_throughput, plot_reliability, plot_peers, plot_cpu, plot_scale, plot_overload)
    written = [p for p in (plot(plt, data, args.out) for plot in plots) if p]
    if not written:
        print("plot: nothing to plot (no results lines it knows)", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path.relative_to(_ROOT) if path.is_relative_to(_ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
