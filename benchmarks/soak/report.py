"""The docs' soak table: ``python -m benchmarks.soak --table benchmarks/results/soak.jsonl``.

One column per line of the file (the runs, in file order), and kiln's published 15-minute
run beside them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["table"]


def _rescue(line: dict[str, Any]) -> str:
    rescue = line["verdict"]["rescue_s"]
    return "—" if not rescue else f"{rescue['p50']} s ({rescue['max']} s)"


def _limits(line: dict[str, Any]) -> str:
    return ", ".join(f"{key} {x['peak']}/{x['max']}" for key, x in sorted(line["verdict"]["limits"].items()))


def _rates(line: dict[str, Any]) -> str:
    parts = [f"{key} {x['excess']} ({x['excess_strict']})" for key, x in sorted(line["verdict"]["rates"].items())]
    return ", ".join(parts)


def _store(line: dict[str, Any]) -> str:
    checks = line["store_checks"]
    if "exit" in checks:
        return "`trioq wal verify`: " + ("clean" if checks["exit"] == 0 else f"exit {checks['exit']}")
    bad = {name: n for name, n in checks.items() if n}
    return f"{len(checks)} SQL checks: " + ("all 0" if not bad else json.dumps(bad))


def _memory(line: dict[str, Any]) -> str:
    memory = line["memory"]
    harness = memory.get("harness_kb")
    if not harness:
        return "—"
    text = (
        f"harness {harness['after_1min'] // 1024} → {harness['end'] // 1024} MiB after the first minute; "
        f"processes ≤ {(memory['child_kb_max'] or 0) // 1024} MiB"
    )
    longest = memory.get("child_longest")
    if longest:
        text += f"; longest-lived process {longest['first_kb'] // 1024} → {longest['last_kb'] // 1024} MiB"
        text += f" over {longest['span_s']} s"
    return text


ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("duration, rate, processes", lambda x: f"{x['settings']['duration'] / 60:g} min, {x['settings']['rate']:g}/s, "
     + (f"{x['settings']['workers']} workers" if x["store"] == "postgres" else "1 server")),
    ("jobs acknowledged (executions)", lambda x: f"{x['verdict']['jobs']:,} ({x['verdict']['executions']:,})"),
    ("SIGKILL / SIGTERM / database restarts",
     lambda x: f"{x['chaos']['sigkill']} / {x['chaos']['sigterm']} / {x['chaos']['db_restart']}"),
    ("lost (acknowledged, not terminal)", lambda x: str(x["verdict"]["lost"])),
    ("over-run / succeeded twice / fencing",
     lambda x: f"{x['verdict']['over_run']} / {x['verdict']['succeeded_twice']} / {x['verdict']['fencing']}"),
    ("unexpected final state", lambda x: str(x["verdict"]["unexpected_final"])),
    ("store vs journal: mismatches / jobs no enqueue made / shared keys", lambda x: (
        f"{x['verdict'].get('store_mismatch', '—')} / {x['verdict'].get('unacked_jobs', '—')} / "
        f"{x['verdict'].get('duplicate_keys', '—')}")),
    ("re-claimed under the same epoch after a crash; ran unacknowledged, lost with the crash", lambda x: (
        f"{x['verdict'].get('epoch_reused_after_crash', '—')}; {x['verdict'].get('ran_unacknowledged', '—')}")),
    ("executions interrupted; orphaned → rescued",
     lambda x: f"{x['verdict']['interrupted']}; {x['verdict']['orphaned']} → {x['verdict']['rescued']}"),
    ("rescue after the kill, p50 (max)", _rescue),
    ("limit peaks / max", _limits),
    ("rate starts over the allowance, < 1 token of slack (strict)", _rates),
    ("fan-in children ran / violations",
     lambda x: f"{x['verdict']['fan_in']['ran']:,} / {x['verdict']['fan_in']['violations']}"),
    ("cron ticks ran once / duplicates / gaps", lambda x: (
        f"{x['verdict']['cron']['ran_once']} of {x['verdict']['cron']['ticks']} / "
        f"{x['verdict']['cron']['duplicates']} / {x['verdict']['cron']['gaps']}")),
    ("store checks", _store),
    ("unexpected process exits; SIGTERM exit codes",
     lambda x: f"{len(x['processes']['unexpected_exits'])}; {x['processes']['sigterm_exit_codes']}"),
    ("drain after the last chaos", lambda x: f"{x['verdict']['drain_s']} s"),
    ("backlog (unfinished jobs), peak / median of the samples", lambda x: (
        f"{x['memory'].get('backlog', {}).get('max', '—')} / {x['memory'].get('backlog', {}).get('median', '—')}")),
    ("memory", _memory),
    ("verdict", lambda x: "clean" if x["verdict"]["ok"] else "**failed**"),
]  # fmt: skip

#: kiln's 15-minute PostgreSQL soak as its authors published it, by row ("—" where they published nothing).
KILN = {
    "duration, rate, processes": "15 min",
    "jobs acknowledged (executions)": "57,211",
    "SIGKILL / SIGTERM / database restarts": "31 / 22 / 3",
    "lost (acknowledged, not terminal)": "0",
    "over-run / succeeded twice / fencing": "0",
}


def table(path: Path) -> str:
    """The markdown table of every run in ``path`` (a ``soak.jsonl``), with kiln's column last."""
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    heads = [f"{line['store']} ({line['date']})" for line in lines]
    out = ["| figure | " + " | ".join(heads) + " | kiln (PostgreSQL) |", "|---" * (len(heads) + 2) + "|"]
    for label, cell in ROWS:
        out.append(f"| {label} | " + " | ".join(cell(line) for line in lines) + f" | {KILN.get(label, '—')} |")
    return "\n".join(out)
