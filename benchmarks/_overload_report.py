"""The overload benchmark's verdicts (``benchmarks/overload.py``): summaries over seeds, targets, tables.

Pure functions of the JSON lines the runs produce: :func:`summarize` turns an arm's per-seed lines
into medians and ranges, :func:`judge` says whether a profile's target held, and :func:`markdown`
renders the tables of ``docs/benchmarks.md`` from a results file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from _common import r3
from _overload_model import OUTCOMES, PROFILES, Arm, Profile, Trace, spread

__all__ = ["judge", "markdown", "summarize"]


def summarize(head: dict[str, Any], arm: Arm, runs: list[dict[str, Any]], traces: list[Trace]) -> dict[str, Any]:
    """The ``overload`` line of one arm: median and min-max over the seeds of each figure."""
    line: dict[str, Any] = {"section": "overload", **head, "arm": arm.name, "seeds": [r["seed"] for r in runs]}
    line["trace_sha256"] = [t.sha256 for t in traces]
    for key in ("on_time_pct", "failed_attempt_pct", "p50_ms", "p99_ms", "above_capacity", "offered"):
        line[key] = spread([r[key] for r in runs])
    for key in OUTCOMES:
        line[key] = spread([r[key] for r in runs])["median"]
    tenants = sorted({name for r in runs for name in r.get("tenant_on_time_pct", {})})
    if tenants:
        line["tenant_on_time_pct"] = {name: spread([r["tenant_on_time_pct"][name] for r in runs]) for name in tenants}
    if arm.limit == "adaptive":
        line["cap_median"] = spread([r["cap_median"] for r in runs])
        notes = {r["note"] for r in runs if "note" in r}
        if notes:
            line["note"] = " / ".join(sorted(notes))
    return line


def _median(summaries: dict[str, dict[str, Any]], arm: str, key: str) -> float | None:
    value = summaries.get(arm, {}).get(key)
    return value["median"] if isinstance(value, dict) else None


def judge(
    profile: Profile, summaries: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """The ``overload_target`` line of a profile: its target in words, ``met`` (``None`` when an arm it
    needs is unavailable), and the figures it was judged on."""
    n = profile.number
    on = {arm: _median(summaries, arm, "on_time_pct") for arm in summaries}
    line: dict[str, Any] = {"section": "overload_target", "target": profile.target}
    met: bool | None
    if n == 1:
        worst = {arm: min(r["on_time_pct"] for r in rs) for arm, rs in runs.items()}
        met, line["worst_on_time_pct"] = all(v >= 99.0 for v in worst.values()), worst
    elif n == 2:
        small = summaries["fairness"].get("tenant_on_time_pct", {}).get(profile.protected or "", {}).get("median")
        met, line["protected_on_time_pct"] = small is not None and small >= 99.0, small
    elif n == 3:
        dd, fifo, defer = on.get("defer+deadline"), on.get("fifo"), on.get("defer")
        p99_dd, p99_defer = _median(summaries, "defer+deadline", "p99_ms"), _median(summaries, "defer", "p99_ms")
        if dd is None or defer is None or fifo is None:
            met = None
        else:
            met = dd > fifo and (p99_dd or math.inf) <= (p99_defer or math.inf)
        line |= {"on_time_pct": on, "p99_ms": {"defer+deadline": p99_dd, "defer": p99_defer}}
    elif n in (4, 7):
        above = [r["above_capacity"] for r in runs.get("limit-4", [])]
        met = bool(above) and max(above) == 0
        if n == 7:
            met = met and (on.get("limit-4") or 0) > (on.get("workers-4") or 0)
        line |= {"above_capacity_under_limit": above, "on_time_pct": on}
    else:
        statics = {arm: v for arm, v in on.items() if arm.startswith("static-") and v is not None}
        adaptive = on.get("adaptive")
        failed = _median(summaries, "adaptive", "failed_attempt_pct")
        line |= {"on_time_pct": on, "adaptive_failed_attempt_pct": failed}
        if adaptive is None or not statics:
            met = None
        elif n in (5, 8):
            best = max(statics.values())
            line["adaptive_vs_best_static"] = r3(adaptive / best) if best else None
            met = adaptive >= 0.95 * best and (failed or 0.0) <= 2.0
        else:
            met = all(adaptive > v for v in statics.values())
    line["met"] = met
    return line


def _fig(value: dict[str, Any] | None, digits: int = 1) -> str:
    """``median (min-max)`` of a :func:`spread`, or ``-``."""
    if not value or value.get("median") is None:
        return "-"
    med, lo, hi = (f"{value[k]:,.{digits}f}" for k in ("median", "min", "max"))
    return med if lo == hi else f"{med} ({lo}-{hi})"


def markdown(lines: Sequence[dict[str, Any]]) -> str:
    """The docs' tables from ``overload`` and ``overload_target`` lines (the last of each profile x arm wins):
    one table per profile, each arm's median and (min-max) over the seeds, then whether the target held."""
    summaries: dict[int, dict[str, dict[str, Any]]] = {}
    targets: dict[int, dict[str, Any]] = {}
    for line in lines:
        if line.get("section") == "overload":
            summaries.setdefault(line["profile"], {})[line["arm"]] = line
        elif line.get("section") == "overload_target":
            targets[line["profile"]] = line
    out: list[str] = []
    for number in sorted(summaries):
        out.append(f"**Profile {number}: {PROFILES[number].name}.** Target: {PROFILES[number].target}.\n")
        columns = ["on time %", "failed attempts %", "p50 ms", "p99 ms", "above capacity", *OUTCOMES[1:]]
        out.append("| arm | " + " | ".join(columns) + " | per tenant on time % |")
        out.append("|---|" + "---:|" * len(columns) + "---|")
        for arm, line in summaries[number].items():
            if "unavailable" in line:
                what = line["unavailable"].split(" raised ")[0]
                out.append(f"| {arm} | unavailable (`{what}` raised TypeError) |" + " |" * 10)
                continue
            tenants = ", ".join(f"{t} {_fig(v)}" for t, v in line.get("tenant_on_time_pct", {}).items()) or "-"
            cells = [
                _fig(line["on_time_pct"]),
                _fig(line["failed_attempt_pct"]),
                _fig(line["p50_ms"], 0),
                _fig(line["p99_ms"], 0),
                _fig(line["above_capacity"], 0),
                *(f"{line[k]:,.0f}" for k in OUTCOMES[1:]),
                tenants,
            ]
            out.append(f"| {arm} | " + " | ".join(cells) + " |")
        met = targets.get(number, {}).get("met")
        out.append(f"\nTarget met: {'unavailable' if met is None else 'yes' if met else 'no'}.\n")
    return "\n".join(out)
