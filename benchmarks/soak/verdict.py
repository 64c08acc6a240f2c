"""The chaos soak's verdict: one run judged from the handlers' side journal, not from the store's counters.

Pure functions of plain JSON-lines data (the only I/O is :func:`load_jsonl` and :func:`load_journal`).
:func:`judge` takes the journal (``start``/``end`` lines of every handler execution), the harness's
acks and event log, the store's final job states and the soak's config, and returns a dict of figures,
one small function per check; ``ok`` is true iff no correctness check failed. :func:`summary_table`
renders the headline figures for a human.

An *execution* is one ``start`` line, paired with the ``end`` line of the same ``(job, epoch, pid)``
(several starts of one key pair with its ends in time order). An execution is *interrupted* when it
has no end, its end is ``cancelled``, or its pid got a ``kill`` within ``lost_window`` seconds after
its ok/error end (or :data:`KILL_LANDS` before it, the signal in flight) *and* the job started again
after that kill (the completion evidently did not reach the store; without a later start it did, and
the execution counts). Only interrupted executions excuse a job running more often than its attempts
allow or succeeding more than once.

Where ``finals`` carry each job's ``epoch``, the store's final state must match the journal
(``store_mismatch``): a succeeded job has an ok end under its final epoch, a dead one an error end
under it (an outcome from a stale epoch accepted, or a state no execution produced, fails).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["judge", "load_journal", "load_jsonl", "summary_table"]

TERMINAL = frozenset({"succeeded", "dead", "cancelled"})
EXAMPLES = 20
#: Seconds a process may run on after the harness logged its SIGKILL (logged, then sent; then delivered).
KILL_LANDS = 0.05
#: Seconds of start-time resolution every rate check allows, its strict one too.
CLOCK_S = 1e-6
_TICK = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?)Z$")

Row = dict[str, Any]
Times = Mapping[int, Sequence[float]]


@dataclass(frozen=True)
class Run:
    """One execution: a start line and, if any, its end line (``end``/``outcome`` ``None`` without one)."""

    job: str
    task: str
    epoch: int
    pid: int
    start: float
    end: float | None = None
    outcome: str | None = None
    parents_ok: bool | None = None
    key: str | None = None
    interrupted: bool = False


def _parse(lines: Iterable[str], where: str, strict: bool) -> tuple[list[Row], int]:
    """The JSON objects of ``lines`` (blank lines skipped) and how many lines were not one.

    ``strict`` raises ``ValueError`` naming ``where`` and the line number on the first bad line instead."""
    rows: list[Row] = []
    bad = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif strict:
            raise ValueError(f"{where}:{number}: not a JSON object: {line[:80]!r}")
        else:
            bad += 1
    return rows, bad


def load_jsonl(path: str | Path) -> list[Row]:
    """Every line of the harness's own file ``path`` (acks, events) as a dict; blank lines are skipped.

    Strict: a line that is not a JSON object raises ``ValueError`` (a dropped ack would hide a lost job)."""
    with open(path, encoding="utf-8") as f:
        return _parse(f, str(path), strict=True)[0]


def load_journal(directory: str | Path) -> tuple[list[Row], int]:
    """``(lines, torn)``: every line of every ``*.jsonl`` file directly in ``directory`` (name order), and
    the number of lines skipped because they were not a JSON object: a writer SIGKILLed mid-line leaves a
    torn last line (bytes that are not UTF-8 are replaced, so they count as torn too). A bad line anywhere
    in a file is skipped and counted the same way. No files: ``([], 0)``."""
    lines: list[Row] = []
    torn = 0
    for path in sorted(Path(directory).glob("*.jsonl")):
        text = path.read_text(encoding="utf-8", errors="replace")
        rows, bad = _parse(text.splitlines(), str(path), strict=False)
        lines += rows
        torn += bad
    return lines, torn


def _first(times: Sequence[float], t: float) -> float | None:
    """The first of the sorted ``times`` at or after ``t``, or ``None``."""
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else None


def _pid_times(events: Sequence[Row], kinds: set[str]) -> dict[int, list[float]]:
    """pid -> sorted t of the harness events of ``kinds``."""
    out: defaultdict[int, list[float]] = defaultdict(list)
    for e in events:
        if e.get("ev") in kinds and "pid" in e:
            out[e["pid"]].append(float(e["t"]))
    return {pid: sorted(ts) for pid, ts in out.items()}


def _runs(journal: Sequence[Row], kills: Times, window: float) -> tuple[list[Run], int]:
    """Every execution in start order, ``interrupted`` set, and the number of end lines without a start (an end
    line stamped before its start is taken at its start)."""
    starts: defaultdict[tuple[str, int, int], list[Row]] = defaultdict(list)
    ends: defaultdict[tuple[str, int, int], list[Row]] = defaultdict(list)
    for line in journal:
        if line.get("ev") in ("start", "end"):
            (starts if line["ev"] == "start" else ends)[(line["job"], line["epoch"], line["pid"])].append(line)
    runs: list[Run] = []
    later: defaultdict[str, list[float]] = defaultdict(list)
    for (job, _, _), group in starts.items():
        later[job] += [float(s["t"]) for s in group]
    for k, group in starts.items():
        closing = sorted(ends.pop(k, []), key=lambda e: float(e["t"]))
        for i, s in enumerate(sorted(group, key=lambda s: float(s["t"]))):
            e = closing[i] if i < len(closing) else {}
            start = float(s["t"])
            end = max(start, float(e["t"])) if e else None
            run = Run(s["job"], s["task"], s["epoch"], s["pid"], start, end, e.get("outcome"), e.get("parents_ok"))
            run = replace(run, key=s.get("key") or e.get("key"))
            runs.append(replace(run, interrupted=_is_interrupted(run, kills, window, later[run.job])))
        ends[k] = closing[len(group) :]
    runs.sort(key=lambda r: (r.start, r.job, r.epoch, r.pid))
    return runs, sum(len(v) for v in ends.values())


def _is_interrupted(run: Run, kills: Times, window: float, starts: Sequence[float]) -> bool:
    """No end, a ``cancelled`` end, or a kill of its pid at most ``window`` seconds after its end that the
    job's ``starts`` show was followed by another start (the outcome was lost with the process). A kill
    logged up to :data:`KILL_LANDS` before the end counts too: the harness logs a kill before it sends
    it, and the process runs on until the signal lands (the one-hour soak saw an end 0.4 ms after it)."""
    if run.end is None or run.outcome == "cancelled":
        return True
    kill = _first(kills.get(run.pid, ()), run.end - KILL_LANDS)
    return kill is not None and kill - run.end <= window and any(t >= kill for t in starts)


def _by_job(runs: Sequence[Run]) -> dict[str, list[Run]]:
    out: defaultdict[str, list[Run]] = defaultdict(list)
    for run in runs:
        out[run.job].append(run)
    return out


def _lost(acked: Mapping[str, Row], finals: Mapping[str, Row]) -> Row:
    """Acked jobs missing from ``finals`` or not terminal there."""
    lost = sorted(j for j in acked if finals.get(j, {}).get("state") not in TERMINAL)
    return {"lost": len(lost), "lost_ids": lost[:EXAMPLES]}


def _unexpected(acked: Mapping[str, Row], finals: Mapping[str, Row], cancelled: set[str]) -> Row:
    """Terminal acked jobs whose state contradicts ``expect``; lost jobs (counted by :func:`_lost`) and jobs the
    harness asked to cancel are not judged here."""
    bad: list[list[str]] = []
    for job, ack in sorted(acked.items()):
        got, want = finals.get(job, {}).get("state"), ack.get("expect", "any")
        if got in TERMINAL and job not in cancelled and want != "any" and got != want:
            bad.append([job, ack["task"], want, got])
    return {"unexpected_final": len(bad), "unexpected_examples": bad[:EXAMPLES]}


def _store_match(jobs: Mapping[str, list[Run]], finals: Mapping[str, Row], acked: Mapping[str, Row], task: Any) -> Row:
    """The store's final state against the journal: ``store_mismatch`` (a succeeded job without an ok end under
    its final epoch, a dead one without an error end under it; without ``epoch`` in finals, any ok end for a
    succeeded job); ``unacked_jobs`` (jobs the store holds that no enqueue answered for, cron ticks aside: a
    resent enqueue that made a second job); ``duplicate_keys`` (one key on two jobs)."""
    bad: list[list[Any]] = []
    for job, final in sorted(finals.items()):
        state, epoch = final.get("state"), final.get("epoch")
        want = {"succeeded": "ok", "dead": "error"}.get(str(state))
        if want is None or (state == "dead" and epoch is None):
            continue
        runs = jobs.get(job, [])
        if not any(r.outcome == want and (epoch is None or r.epoch == epoch) for r in runs):
            bad.append([job, final.get("task"), state, epoch])
    unacked = sorted(j for j, f in finals.items() if j not in acked and f.get("task") != task)
    keys = Counter(f["key"] for f in finals.values() if f.get("key"))
    return {
        "store_mismatch": len(bad),
        "store_mismatch_examples": bad[:EXAMPLES],
        "unacked_jobs": len(unacked),
        "unacked_ids": unacked[:EXAMPLES],
        "duplicate_keys": sum(n > 1 for n in keys.values()),
    }


def _fencing(runs: Sequence[Run], stops: Times) -> Row:
    """(job, epoch) pairs started again while an earlier start of the pair could still run (its process not
    killed or gone before the later start): two workers holding one claim. A pair started again only after
    its process died is ``epoch_reused_after_crash``: a store whose claims are not durable before the
    handler starts (the WAL's lazy CLAIM records, docs/decisions.md) replays to the epoch before and claims
    it anew; no holder of the old claim is left to complete it."""
    by_pair: defaultdict[tuple[str, int], list[Run]] = defaultdict(list)
    for r in runs:
        by_pair[(r.job, r.epoch)].append(r)
    live: list[list[Any]] = []
    reused = 0
    for (job, epoch), group in sorted(by_pair.items()):
        group.sort(key=lambda r: r.start)
        for before, after in itertools.pairwise(group):
            gone = _first(stops.get(before.pid, ()), before.start)
            if gone is not None and gone <= after.start:
                reused += 1
            else:
                live.append([job, epoch, before.pid, after.pid])
    return {"fencing": len(live), "fencing_examples": live[:EXAMPLES], "epoch_reused_after_crash": reused}


def _over_run(jobs: Mapping[str, list[Run]], attempts: Mapping[str, int], retries: Counter[str]) -> Row:
    """Jobs started more often than ``max_attempts * (1 + ok retries) + interrupted`` (every start line counts,
    fenced duplicates too), and jobs with more than one ok end that is not interrupted. Jobs with no known
    ``max_attempts`` (neither acked nor cron ticks) are only counted in ``unknown_jobs``."""
    over, twice, unknown = [], [], 0
    for job, runs in sorted(jobs.items()):
        twice += [job] if sum(r.outcome == "ok" and not r.interrupted for r in runs) > 1 else []
        if job not in attempts:
            unknown += 1
        elif len(runs) > attempts[job] * (1 + retries[job]) + sum(r.interrupted for r in runs):
            over.append(job)
    return {
        "over_run": len(over),
        "over_run_ids": over[:EXAMPLES],
        "succeeded_twice": len(twice),
        "succeeded_twice_ids": twice[:EXAMPLES],
        "unknown_jobs": unknown,
    }


def _orphans(
    runs: Sequence[Run], jobs: Mapping[str, list[Run]], kills: Times, finals: Mapping[str, Row], unowned: set[str]
) -> Row:
    """Executions without an end whose pid was killed after they started (orphaned); rescued by a start of the
    same job after that kill, or by the job's terminal final state. ``rescue_s``: next start - kill. Jobs in
    ``unowned`` (ran, never acknowledged, gone with the crash: see :func:`_unowned`) are not judged here."""
    orphaned = rescued = 0
    delays: list[float] = []
    for run in runs:
        kill = _first(kills.get(run.pid, ()), run.start) if run.end is None else None
        if kill is None or run.job in unowned:
            continue
        orphaned += 1
        later = [r.start for r in jobs[run.job] if r.start > kill]
        delays += [min(later) - kill] if later else []
        rescued += bool(later) or finals.get(run.job, {}).get("state") in TERMINAL
    rescue = {"p50": round(statistics.median(delays), 3), "max": round(max(delays), 3)} if delays else None
    return {
        "interrupted": sum(r.interrupted for r in runs),
        "orphaned": orphaned,
        "rescued": rescued,
        "unrescued": orphaned - rescued,
        "rescue_s": rescue,
    }


def _unowned(jobs: Mapping[str, list[Run]], known: set[str], finals: Mapping[str, Row], kills: Times) -> set[str]:
    """Jobs that ran but that no enqueue answered for, the store does not hold, and whose every execution was
    cut off by a SIGKILL of its process: a job the store handed to a worker before its ADD was durable, lost
    with the process (the WAL's decision: workers hear of a job before its record is synced), its enqueue
    never acknowledged (the caller sends it again). Any other unknown job fails the run (``unknown_jobs``)."""
    out = set()
    for job, runs in jobs.items():
        if job in known or job in finals:
            continue
        if all(r.end is None and _first(kills.get(r.pid, ()), r.start) is not None for r in runs):
            out.add(job)
    return out


def _stop(run: Run, stops: Times) -> float:
    """Where an execution's interval ends: its end line, else its pid's first kill/exit after its start, else inf."""
    if run.end is not None:
        return run.end
    stop = _first(stops.get(run.pid, ()), run.start)
    return math.inf if stop is None else stop


def _peak(intervals: Sequence[tuple[float, float]], cap: int) -> tuple[int, int]:
    """(peak overlap, starts at which the open count exceeded ``cap``). At one instant ends come before starts,
    except an interval's end at its own start t (zero length), which comes after the starts."""
    points = sorted([(s, 1) for s, _ in intervals] + [(e, 2 if e == s else 0) for s, e in intervals])
    open_ = peak = violations = 0
    for _, kind in points:
        if kind == 1:
            open_ += 1
            peak, violations = max(peak, open_), violations + (open_ > cap)
        else:
            open_ -= 1
    return peak, violations


def _holders(runs: Sequence[Run], config: Row, key: str) -> list[Run]:
    tasks = {t for t, keys in config.get("task_limits", {}).items() if key in keys}
    return [r for r in runs if r.task in tasks]


def _limits(runs: Sequence[Run], config: Row, stops: Times) -> Row:
    """Per limit key with a ``max``: peak concurrent executions of the tasks holding it, and violations."""
    out: dict[str, Row] = {}
    for key, limit in sorted(config.get("limits", {}).items()):
        if limit.get("max") is None:
            continue
        spans = [(r.start, _stop(r, stops)) for r in _holders(runs, config, key)]
        peak, violations = _peak(spans, limit["max"])
        unended = sum(e == math.inf for _, e in spans)
        out[key] = {"max": limit["max"], "peak": peak, "violations": violations, "unended": unended}
    return {"limits": out, "limit_violations": sum(v["violations"] for v in out.values())}


def _excess(times: Sequence[float], rate: float, per: float, burst: int, slack: float) -> int:
    """How many of the sorted start ``times`` came too early: start ``j`` counts when some window ``[t_i, t_j]``
    (``i <= j``) holds more than ``burst + rate * (t_j - t_i + slack) / per`` starts. Not the floor of the worst
    window's overage, which would pass ``burst + 1`` starts at once. O(n): the running minimum of
    ``i - rate * t_i / per``. ``CLOCK_S`` more slack absorbs float rounding of epoch seconds (~0.24 us)."""
    low, early = math.inf, 0
    for j, t in enumerate(times):
        x = rate * (t - times[0]) / per
        low = min(low, j - x)
        early += j + 1 - burst - x - rate * (slack + CLOCK_S) / per - low > 0
    return early


def _busiest(times: Sequence[float], width: float = 1.0) -> int:
    """The most of the sorted ``times`` in any half-open window ``[t, t + width)``."""
    best = i = 0
    for j, t in enumerate(times):
        while t - times[i] >= width:
            i += 1
        best = max(best, j - i + 1)
    return best


def _rates(runs: Sequence[Run], config: Row, slack: float) -> Row:
    """Per limit key with a ``rate`` (``per`` default 1, ``burst`` default 1): ``excess``, the starts of the
    tasks holding it that came early by more than ``rate_slack`` seconds (:func:`_excess`), ``excess_strict``
    with no slack, and the most starts in any 1 s window."""
    out: dict[str, Row] = {}
    for key, limit in sorted(config.get("limits", {}).items()):
        if limit.get("rate") is None:
            continue
        rate, per, burst = float(limit["rate"]), float(limit.get("per") or 1.0), int(limit.get("burst") or 1)
        # Never a whole token of slack: a limiter one burst too generous must still show.
        key_slack = min(slack, 0.9 * per / rate)
        times = sorted(r.start for r in _holders(runs, config, key))
        out[key] = {
            "rate": rate,
            "per": per,
            "burst": burst,
            "starts": len(times),
            "slack_s": round(key_slack, 4),
            "excess": _excess(times, rate, per, burst, key_slack),
            "excess_strict": _excess(times, rate, per, burst, 0.0),
            "busiest_window_1s": _busiest(times),
        }
    return {"rates": out, "rate_violations": sum(v["excess"] for v in out.values())}


def _fan_in(acked: Mapping[str, Row], jobs: Mapping[str, list[Run]]) -> Row:
    """Children (acked with parents): every start must follow an ok end of each parent (the first: a crash
    that loses the parents' successes and the child's run after them re-runs both, and the child's second
    start follows the parents' second successes), and every ok end must report ``parents_ok`` true (missing
    counts as false). ``violations`` counts children with any problem; ``examples`` lists ``[child, problem]``."""
    done: dict[str, float] = {}
    for r in (r for rs in jobs.values() for r in rs):
        if r.outcome == "ok" and r.end is not None:
            done[r.job] = min(done.get(r.job, r.end), r.end)
    flows = ran = violations = 0
    examples: list[list[str]] = []
    for job, ack in sorted(acked.items()):
        if not ack.get("parents"):
            continue
        flows += 1
        runs = jobs.get(job, [])
        ran += any(r.outcome == "ok" for r in runs)
        problems = [
            f"epoch {r.epoch}: parents_ok false" for r in runs if r.outcome == "ok" and r.parents_ok is not True
        ]
        for r in runs:
            for parent in ack["parents"]:
                if parent not in done:
                    problems.append(f"epoch {r.epoch}: parent {parent} has no ok end")
                elif r.start < done[parent]:
                    problems.append(f"epoch {r.epoch}: started {done[parent] - r.start:.3f}s before {parent} ended ok")
        violations += bool(problems)
        examples += [[job, p] for p in problems][: EXAMPLES - len(examples)]
    return {"fan_in": {"flows": flows, "ran": ran, "violations": violations, "examples": examples}}


def _tick_time(key: str) -> float | None:
    """The tick of a ``cron:<name>:<ISO>Z`` key as epoch seconds, ``None`` if it has none."""
    m = _TICK.search(key)
    return datetime.fromisoformat(m.group(1) + "+00:00").timestamp() if m else None


def _cron(runs: Sequence[Run], finals: Mapping[str, Row], config: Row) -> Row:
    """Per tick key (journal key, else the job's final key, else ``job:<id>``): counted ok ends. ``ticks`` are
    the distinct keys of cron jobs in ``finals``; ``duplicates`` also counts keys seen only in the journal."""
    task = config.get("cron_task")
    ticks = {f.get("key") or f"job:{j}": f["state"] for j, f in finals.items() if task and f.get("task") == task}
    counted: Counter[str] = Counter()
    any_ok: Counter[str] = Counter()
    started: set[str] = set()
    for r in runs:
        if r.task == task:
            key = r.key or finals.get(r.job, {}).get("key") or f"job:{r.job}"
            started.add(key)
            if r.outcome == "ok":
                any_ok[key] += 1
                counted[key] += not r.interrupted
    dups = sorted(k for k, n in counted.items() if n > 1)
    # An ok end a kill excuses (it may not have reached the store) is still a run: a tick whose only ok end
    # was excused ran once; one with a second ok end after an excused one ran again, as allowed.
    # A tick still pending when the workers stopped (due after the drain) is not a failure; one that ended
    # succeeded or dead without any execution is.
    never = [k for k in ticks if k not in started and ticks[k] in ("succeeded", "dead")]
    times = sorted({t for k in ticks if (t := _tick_time(k)) is not None})
    period = config.get("cron_period")
    off_grid = sum(1 for t in times if period and abs(t / period - round(t / period)) > 1e-6)
    gaps = None if not times or not period else max(0, round((times[-1] - times[0]) / period) + 1 - len(times))
    return {
        "cron": {
            "ticks": len(ticks),
            "ran_once": sum(any_ok[k] == 1 for k in ticks),
            "reran_after_kill": sum(any_ok[k] > 1 and counted[k] <= 1 for k in ticks),
            "duplicates": len(dups),
            "duplicate_keys": dups[:EXAMPLES],
            "never_ran": len(never),
            "succeeded_without_run": sum(ticks[k] == "succeeded" and not any_ok[k] for k in ticks),
            "pending_at_stop": sum(ticks[k] not in TERMINAL for k in ticks),
            "off_grid": off_grid,
            "gaps": gaps,
        }
    }


def _drain(events: Sequence[Row]) -> float | None:
    """t(drained) - t(chaos_end) (the last chaos_end, the first drained), ``None`` if either is missing."""
    chaos = [float(e["t"]) for e in events if e.get("ev") == "chaos_end"]
    drained = [float(e["t"]) for e in events if e.get("ev") == "drained"]
    return round(min(drained) - max(chaos), 3) if chaos and drained else None


def judge(
    journal: Sequence[Row], acks: Sequence[Row], events: Sequence[Row], finals: Mapping[str, Row], config: Row
) -> dict[str, Any]:
    """The verdict of one soak run (see the module docstring and each check's docstring); pure.

    Config defaults: ``lost_window`` 5.0, ``rate_slack`` 0.1, ``cron_max_attempts`` 1, no limits, no cron.
    A job acked twice is judged once (``jobs`` is still ``len(acks)``)."""
    kills = _pid_times(events, {"kill"})
    runs, unmatched = _runs(journal, kills, float(config.get("lost_window", 5.0)))
    jobs = _by_job(runs)
    acked = {a["job"]: a for a in acks}
    task = config.get("cron_task")
    cron_jobs = {j for j, f in finals.items() if f.get("task") == task} | {r.job for r in runs if r.task == task}
    attempts = {j: int(config.get("cron_max_attempts", 1)) for j in cron_jobs if task is not None}
    attempts |= {j: int(a["max_attempts"]) for j, a in acked.items()}
    retries = Counter(e["job"] for e in events if e.get("ev") == "retry" and e.get("ok"))
    cancelled = {e["job"] for e in events if e.get("ev") == "cancel"}
    stops = _pid_times(events, {"kill", "exit"})
    v: dict[str, Any] = {
        "jobs": len(acks),
        "executions": len({(r.job, r.epoch) for r in runs}),
        "ticks": sum(f.get("task") == task for f in finals.values()) if task else 0,
        "unmatched_ends": unmatched,
        "unended": sum(_stop(r, stops) == math.inf for r in runs),
    }
    unowned = _unowned(jobs, set(attempts), finals, kills)
    v |= _lost(acked, finals) | _unexpected(acked, finals, cancelled) | _fencing(runs, stops)
    v |= _store_match(jobs, finals, acked, task)
    v |= _over_run({j: r for j, r in jobs.items() if j not in unowned}, attempts, retries)
    v |= _orphans(runs, jobs, kills, finals, unowned) | {"ran_unacknowledged": len(unowned)}
    v |= _limits(runs, config, stops) | _rates(runs, config, float(config.get("rate_slack", 0.1)))
    v |= _fan_in(acked, jobs) | _cron(runs, finals, config) | {"drain_s": _drain(events)}
    failures = "lost unexpected_final fencing over_run succeeded_twice unrescued limit_violations rate_violations"
    failures += " store_mismatch unacked_jobs duplicate_keys unknown_jobs unmatched_ends"
    cron = v["cron"]
    v["ok"] = not any(v[k] for k in failures.split()) and not (
        v["fan_in"]["violations"]
        or cron["duplicates"]
        or cron["never_ran"]
        or cron["off_grid"]
        or cron["succeeded_without_run"]
    )
    return v


def summary_table(verdict: Mapping[str, Any]) -> str:
    """The headline figures as a plain two-column table (label, value), one per line; ``-`` for ``None``."""
    fan, cron, rescue = verdict["fan_in"], verdict["cron"], verdict["rescue_s"] or {}
    rows = [("verdict", "OK" if verdict["ok"] else "FAIL")]
    heads = "jobs executions ticks lost unexpected_final store_mismatch unacked_jobs duplicate_keys fencing over_run"
    heads += " succeeded_twice interrupted orphaned epoch_reused_after_crash ran_unacknowledged"
    rows += [(k, verdict[k]) for k in (*heads.split(), "rescued", "unrescued")]
    rows += [("rescue_s p50 / max", f"{rescue.get('p50', '-')} / {rescue.get('max', '-')}")]
    rows += [(f"limit {k} peak / max", f"{x['peak']} / {x['max']}") for k, x in verdict["limits"].items()]
    rows += [("limit_violations", verdict["limit_violations"])]
    rows += [
        (f"rate {k} excess (strict)", f"{x['excess']} ({x['excess_strict']})") for k, x in verdict["rates"].items()
    ]
    rows += [
        ("rate_violations", verdict["rate_violations"]),
        ("fan-in ran / flows", f"{fan['ran']} / {fan['flows']}"),
        ("fan-in violations", fan["violations"]),
        ("cron ran_once / ticks", f"{cron['ran_once']} / {cron['ticks']}"),
        ("cron duplicates", cron["duplicates"]),
        ("cron succeeded_without_run", cron["succeeded_without_run"]),
        ("cron gaps", cron["gaps"]),
        ("drain_s", verdict["drain_s"]),
    ]
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {'-' if value is None else value}" for label, value in rows)
