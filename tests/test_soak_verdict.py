"""The chaos soak's verdict (benchmarks/soak/verdict.py) on small synthetic runs.

Every check is shown failing on a bad input and passing on a good one next to it, so none of these
tests could pass with the check removed. Times are epoch seconds like the journal's ``time.time()``.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_700_000_000.0


def load_verdict() -> ModuleType:
    """benchmarks/soak/verdict.py by its path: a pure module, needing neither the package nor sys.path."""
    spec = importlib.util.spec_from_file_location("soak_verdict", ROOT / "benchmarks" / "soak" / "verdict.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


verdict = load_verdict()

Row = dict[str, Any]


def start(job: str, epoch: int, pid: int, t: float, task: str = "t", **extra: Any) -> Row:
    return {"ev": "start", "job": job, "task": task, "attempt": epoch, "epoch": epoch, "pid": pid, "t": T0 + t, **extra}


def end(job: str, epoch: int, pid: int, t: float, outcome: str = "ok", task: str = "t", **extra: Any) -> Row:
    return {**start(job, epoch, pid, t, task, **extra), "ev": "end", "outcome": outcome}


def ran(
    job: str, epoch: int, pid: int, t0: float, t1: float, outcome: str = "ok", task: str = "t", **extra: Any
) -> list[Row]:
    """A start and its end."""
    return [start(job, epoch, pid, t0, task, **extra), end(job, epoch, pid, t1, outcome, task, **extra)]


def ack(
    job: str, task: str = "t", max_attempts: int = 1, expect: str = "succeeded", parents: Sequence[str] = ()
) -> Row:
    return {"job": job, "task": task, "max_attempts": max_attempts, "expect": expect, "parents": list(parents), "t": T0}


def ev(kind: str, t: float, **extra: Any) -> Row:
    return {"t": T0 + t, "ev": kind, **extra}


def final(state: str = "succeeded", task: str = "t", key: str | None = None) -> Row:
    return {"state": state, "attempts": 1, "task": task, "key": key}


def judge(
    journal: Sequence[Row] = (),
    acks: Sequence[Row] = (),
    events: Sequence[Row] = (),
    finals: dict[str, Row] | None = None,
    config: Row | None = None,
) -> Row:
    """The verdict; ``finals`` default: every acked job succeeded."""
    finals = {a["job"]: final(task=a["task"]) for a in acks} if finals is None else finals
    return dict(verdict.judge(list(journal), list(acks), list(events), finals, config or {}))


def test_a_clean_run_is_ok_and_counts_jobs_executions_ticks() -> None:
    journal = [*ran("a", 1, 10, 0, 1), *ran("b", 1, 10, 1, 2), *ran("b", 2, 11, 3, 4, outcome="error")]
    acks = [ack("a"), ack("b", max_attempts=2)]
    finals = {"a": final(), "b": final(), "c1": final(task="cron", key="cron:c:2026-01-01T00:00:00Z")}
    journal += ran("c1", 1, 10, 5, 6, task="cron", key="cron:c:2026-01-01T00:00:00Z")
    v = judge(journal, acks, [ev("chaos_end", 10), ev("drained", 12.5)], finals, {"cron_task": "cron"})
    assert (v["jobs"], v["executions"], v["ticks"], v["drain_s"]) == (2, 4, 1, 2.5)
    assert v["ok"] is True
    assert v["over_run"] == v["interrupted"] == v["unended"] == v["unmatched_ends"] == 0


def test_lost_jobs_are_missing_or_not_terminal() -> None:
    acks = [ack("a"), ack("b"), ack("c")]
    v = judge(acks=acks, finals={"a": final(), "b": final("running")})
    assert (v["lost"], v["lost_ids"], v["ok"]) == (2, ["b", "c"], False)
    v = judge(acks=acks, finals={"a": final(), "b": final("dead"), "c": final("cancelled")})
    assert v["lost"] == 0 and v["lost_ids"] == []


def test_unexpected_final_except_jobs_the_harness_cancelled() -> None:
    acks = [ack("a"), ack("b", expect="dead"), ack("c", expect="any")]
    finals = {"a": final("dead"), "b": final("dead"), "c": final("cancelled")}
    v = judge(acks=acks, finals=finals)
    assert (v["unexpected_final"], v["unexpected_examples"], v["ok"]) == (1, [["a", "t", "succeeded", "dead"]], False)
    v = judge(acks=acks, events=[ev("cancel", 1, job="a")], finals=finals)
    assert (v["unexpected_final"], v["ok"]) == (0, True)
    v = judge(acks=acks, finals={**finals, "a": final()})
    assert v["unexpected_final"] == 0


def test_fencing_two_starts_of_one_claim() -> None:
    bad = [*ran("a", 1, 10, 0, 1), *ran("a", 1, 11, 0.5, 1.5)]
    v = judge(bad, [ack("a", max_attempts=2)])
    assert (v["fencing"], v["fencing_examples"], v["executions"], v["ok"]) == (1, [["a", 1, 10, 11]], 1, False)
    good = [*ran("a", 1, 10, 0, 1, outcome="error"), *ran("a", 2, 11, 1.5, 2)]
    assert judge(good, [ack("a", max_attempts=2)])["fencing"] == 0
    # The same epoch again only after its process was SIGKILLed (a claim record lost with the crash, replayed
    # to the epoch before): no holder of the first claim is left, so it is counted, not failed.
    crash = [start("a", 1, 10, 0), *ran("a", 1, 11, 2, 3)]
    v = judge(crash, [ack("a", max_attempts=1)], [ev("kill", 0.5, pid=10)])
    assert (v["fencing"], v["epoch_reused_after_crash"], v["ok"]) == (0, 1, True)
    # ... but a kill after the second start excuses nothing: both held the claim at once.
    v = judge(crash, [ack("a", max_attempts=1)], [ev("kill", 2.5, pid=10)])
    assert (v["fencing"], v["epoch_reused_after_crash"], v["ok"]) == (1, 0, False)


def test_a_job_that_ran_unacknowledged_and_died_with_the_process_is_counted_not_failed() -> None:
    ran_once = [start("x", 1, 10, 0)]  # handed out before its ADD was durable; the process killed
    v = judge(ran_once, [], [ev("kill", 0.1, pid=10)], finals={})
    assert (v["ran_unacknowledged"], v["unknown_jobs"], v["unrescued"], v["ok"]) == (1, 0, 0, True)
    # Unknown, and it ended normally (or the store holds it, or no kill cut it off): a failure.
    assert judge([*ran("x", 1, 10, 0, 0.05)], [], [ev("kill", 0.1, pid=10)], finals={})["unknown_jobs"] == 1
    assert judge(ran_once, [], [], finals={})["ok"] is False


def test_over_run_unless_a_kill_excuses_the_completion() -> None:
    journal = [*ran("a", 1, 10, 0, 1, outcome="error"), *ran("a", 2, 11, 5, 6, outcome="error")]
    acks = [ack("a", max_attempts=1, expect="dead")]
    finals = {"a": final("dead")}
    v = judge(journal, acks, finals=finals)
    assert (v["over_run"], v["over_run_ids"], v["ok"]) == (1, ["a"], False)
    # Killed 1.5 s after its end, and the job ran again after the kill: the failure did not reach the store.
    v = judge(journal, acks, [ev("kill", 2.5, pid=10)], finals)
    assert (v["over_run"], v["interrupted"], v["ok"]) == (0, 1, True)
    # Killed later than lost_window after its end: no excuse.
    assert judge(journal, acks, [ev("kill", 3.5, pid=10)], finals, {"lost_window": 2.0})["over_run"] == 1
    # Killed within the window, but the job did not start again after the kill: the outcome had reached the
    # store (the run at 5 s was not a rescue of this one), so the kill excuses nothing.
    assert judge(journal, acks, [ev("kill", 5.5, pid=10)], finals)["over_run"] == 1
    # A kill well before the end excuses nothing either (the end line was written, the pid still lived)...
    assert judge(journal, acks, [ev("kill", 0.5, pid=10)], finals)["over_run"] == 1
    # ... but one logged a moment before it does: the signal was on its way (logged, then sent, then delivered).
    v = judge(journal, acks, [ev("kill", 0.99, pid=10)], finals)
    assert (v["over_run"], v["interrupted"], v["ok"]) == (0, 1, True)
    assert judge(journal, acks, [ev("kill", 2.5, pid=10)], finals, {"lost_window": 1.0})["over_run"] == 1


def test_over_run_allows_max_attempts_again_per_accepted_retry() -> None:
    journal = [*ran("a", 1, 10, 0, 1, outcome="error"), *ran("a", 2, 10, 5, 6)]
    acks = [ack("a", max_attempts=1, expect="any")]
    assert judge(journal, acks, [ev("retry", 3, job="a", ok=False)])["over_run"] == 1
    assert judge(journal, acks, [ev("retry", 3, job="a", ok=True)])["over_run"] == 0


def test_cancelled_and_unended_executions_are_interrupted() -> None:
    journal = [*ran("a", 1, 10, 0, 1, outcome="cancelled"), start("a", 2, 11, 2), *ran("a", 3, 12, 10, 11)]
    v = judge(journal, [ack("a", max_attempts=1)], [ev("kill", 3, pid=11)])
    assert (v["interrupted"], v["over_run"], v["ok"]) == (2, 0, True)
    v = judge(journal, [ack("a", max_attempts=1)], [ev("kill", 3, pid=11)], config={"lost_window": 0.0})
    assert v["interrupted"] == 2  # neither needs the window: no end, or a cancelled one
    journal[1]["outcome"] = "error"
    assert judge(journal, [ack("a", max_attempts=1)], [ev("kill", 3, pid=11)])["over_run"] == 1


def test_succeeded_twice_unless_the_first_success_was_cut_off() -> None:
    journal = [*ran("a", 1, 10, 0, 1), *ran("a", 2, 11, 5, 6)]
    acks = [ack("a", max_attempts=2)]
    v = judge(journal, acks)
    assert (v["succeeded_twice"], v["succeeded_twice_ids"], v["over_run"], v["ok"]) == (1, ["a"], 0, False)
    v = judge(journal, acks, [ev("kill", 1.2, pid=10)])
    assert (v["succeeded_twice"], v["ok"]) == (0, True)


def test_orphans_are_rescued_by_a_later_start_or_a_terminal_state() -> None:
    journal = [start("a", 1, 10, 0), *ran("a", 2, 11, 4, 5)]
    v = judge(journal, [ack("a", max_attempts=1)], [ev("kill", 1, pid=10)])
    assert (v["orphaned"], v["rescued"], v["unrescued"], v["rescue_s"], v["ok"]) == (
        1,
        1,
        0,
        {"p50": 3.0, "max": 3.0},
        True,
    )
    # No later start, the store still holds it running: unrescued (and lost).
    alone = [start("a", 1, 10, 0)]
    v = judge(alone, [ack("a")], [ev("kill", 1, pid=10)], {"a": final("running")})
    assert (v["orphaned"], v["unrescued"], v["rescue_s"], v["lost"], v["ok"]) == (1, 1, None, 1, False)
    # Cancelled by the harness after the kill: terminal anyway.
    v = judge(alone, [ack("a")], [ev("kill", 1, pid=10), ev("cancel", 2, job="a")], {"a": final("cancelled")})
    assert (v["rescued"], v["unrescued"], v["ok"]) == (1, 0, True)
    # A pid that was never killed orphans nothing (its execution is only interrupted).
    v = judge(alone, [ack("a")], [], {"a": final("running")})
    assert (v["orphaned"], v["interrupted"], v["unended"]) == (0, 1, 1)


LIMIT: Row = {"limits": {"m": {"max": 1, "rate": None, "per": 1.0, "burst": 1}}, "task_limits": {"lim": ["m"]}}


def test_limit_peak_touching_intervals_do_not_overlap() -> None:
    acks = [ack("a", "lim"), ack("b", "lim")]
    touching = [*ran("a", 1, 10, 0, 1, task="lim"), *ran("b", 1, 11, 1, 2, task="lim")]
    v = judge(touching, acks, config=LIMIT)
    assert v["limits"] == {"m": {"max": 1, "peak": 1, "violations": 0, "unended": 0}} and v["ok"]
    overlapping = [*ran("a", 1, 10, 0, 1, task="lim"), *ran("b", 1, 11, 0.999, 2, task="lim")]
    v = judge(overlapping, acks, config=LIMIT)
    assert (v["limits"]["m"]["peak"], v["limit_violations"], v["ok"]) == (2, 1, False)
    # Tasks that do not hold the key are not counted.
    v = judge(overlapping, acks, config={**LIMIT, "task_limits": {"other": ["m"]}})
    assert v["limit_violations"] == 0


def test_limit_an_execution_without_end_ends_at_its_pids_kill_or_exit() -> None:
    acks = [ack("a", "lim", max_attempts=2), ack("b", "lim")]
    journal = [start("a", 1, 10, 0, task="lim"), *ran("b", 1, 11, 2, 3, task="lim"), *ran("a", 2, 11, 4, 5, task="lim")]
    v = judge(journal, acks, [ev("kill", 1, pid=10)], config=LIMIT)
    assert v["limits"]["m"] == {"max": 1, "peak": 1, "violations": 0, "unended": 0} and v["ok"]
    v = judge(journal, acks, [ev("exit", 2, pid=10, code=1)], config=LIMIT)  # exit at b's start: ends first
    assert v["limits"]["m"]["violations"] == 0
    v = judge(journal, acks, [ev("kill", 2.5, pid=10)], config=LIMIT)
    assert (v["limits"]["m"]["peak"], v["limit_violations"]) == (2, 1)
    # Never killed, never seen exiting: runs to +inf, overlapping both later executions.
    v = judge(journal, acks, [ev("kill", -1, pid=10)], config=LIMIT)  # a kill before the start does not end it
    assert v["limits"]["m"] == {"max": 1, "peak": 2, "violations": 2, "unended": 1}
    assert (v["unended"], v["ok"]) == (1, False)


RATE: Row = {"limits": {"r": {"max": None, "rate": 10.0, "per": 1.0, "burst": 2}}, "task_limits": {"rt": ["r"]}}


def rated(times: Sequence[float]) -> tuple[list[Row], list[Row]]:
    journal = [line for i, t in enumerate(times) for line in ran(f"j{i}", 1, 10, t, t + 0.01, task="rt")]
    return journal, [ack(f"j{i}", "rt") for i in range(len(times))]


def test_rate_a_burst_over_the_allowance_fails() -> None:
    # 10/s, burst 2: the third start is due at 0.1, the fourth at 0.2; both are early by more than the slack
    # (0.09 s: never a whole token, whatever rate_slack says).
    v = judge(*rated([0.0, 0.001, 0.002, 0.003]), config=RATE)
    assert v["rates"]["r"] == {
        "rate": 10.0,
        "per": 1.0,
        "burst": 2,
        "starts": 4,
        "slack_s": 0.09,
        "excess": 2,
        "excess_strict": 2,
        "busiest_window_1s": 4,
    }
    assert (v["rate_violations"], v["ok"]) == (2, False)
    # The third start 5 ms before it is due: within the slack, early only to the strict count.
    v = judge(*rated([0.0, 0.001, 0.095]), config=RATE)
    assert (v["rates"]["r"]["excess"], v["rates"]["r"]["excess_strict"], v["ok"]) == (0, 1, True)
    v = judge(*rated([0.0, 0.001, 0.2]), config=RATE)
    assert (v["rates"]["r"]["excess_strict"], v["rate_violations"], v["ok"]) == (0, 0, True)


def test_rate_an_even_stream_at_the_rate_passes_and_a_faster_one_fails() -> None:
    even = [i * 0.1 for i in range(200)]  # exactly 10/s at epoch magnitudes, rounding and all
    v = judge(*rated(even), config=RATE)
    assert (v["rates"]["r"]["excess"], v["rates"]["r"]["excess_strict"], v["ok"]) == (0, 0, True)
    assert v["rates"]["r"]["busiest_window_1s"] == 10
    fast = [i * 0.09 for i in range(200)]  # 11.1/s: the burst's spare start is soon used up, then every start early
    v = judge(*rated(fast), config=RATE)
    assert v["rates"]["r"]["excess"] > 150 and not v["ok"]


def test_rate_slack_absorbs_starts_a_little_early() -> None:
    config = {**RATE, "limits": {"r": {"max": None, "rate": 10.0, "per": 1.0, "burst": 1}}}
    jittered = [0.0, 0.05, 0.2, 0.3]  # the second start 0.05 s early, the rest on time
    v = judge(*rated(jittered), config=config)
    assert (v["rates"]["r"]["excess"], v["rates"]["r"]["excess_strict"], v["ok"]) == (0, 1, True)
    v = judge(*rated(jittered), config={**config, "rate_slack": 0.01})
    assert (v["rates"]["r"]["excess"], v["rate_violations"], v["ok"]) == (1, 1, False)


def test_fan_in_a_child_must_start_after_its_parents_succeeded() -> None:
    acks = [ack("p1"), ack("p2"), ack("c", parents=["p1", "p2"])]
    parents = [*ran("p1", 1, 10, 0, 1), *ran("p2", 1, 11, 0, 2)]
    good = [*parents, *ran("c", 1, 10, 2.5, 3, parents_ok=True)]
    v = judge(good, acks)
    assert (v["fan_in"], v["ok"]) == ({"flows": 1, "ran": 1, "violations": 0, "examples": []}, True)
    early = [*parents, *ran("c", 1, 10, 1.5, 3, parents_ok=True)]
    v = judge(early, acks)
    assert (v["fan_in"]["violations"], v["ok"]) == (1, False)
    assert v["fan_in"]["examples"] == [["c", "epoch 1: started 0.500s before p2 ended ok"]]
    # A crash lost the parents' successes and the child's run after them: both ran again, the parents first.
    crashed = [*good, *ran("p1", 2, 12, 10, 11), *ran("p2", 2, 12, 10, 11), *ran("c", 1, 12, 11.5, 12, parents_ok=True)]
    v = judge(crashed, acks, [ev("kill", 3.1, pid=10), ev("kill", 3.1, pid=11)])
    assert (v["fan_in"]["violations"], v["ok"]) == (0, True)


def test_fan_in_parents_ok_false_or_a_parent_that_never_succeeded() -> None:
    acks = [ack("p"), ack("c", parents=["p"])]
    v = judge([*ran("p", 1, 10, 0, 1), *ran("c", 1, 10, 2, 3, parents_ok=False)], acks)
    assert (v["fan_in"]["violations"], v["fan_in"]["examples"], v["ok"]) == (
        1,
        [["c", "epoch 1: parents_ok false"]],
        False,
    )
    v = judge([*ran("p", 1, 10, 0, 1), *ran("c", 1, 10, 2, 3)], acks)  # an ok end without parents_ok
    assert v["fan_in"]["violations"] == 1
    v = judge([*ran("p", 1, 10, 0, 1, outcome="error"), *ran("c", 1, 10, 2, 3, parents_ok=True)], acks)
    assert v["fan_in"]["examples"] == [["c", "epoch 1: parent p has no ok end"]]
    # A child that never ran breaks nothing.
    v = judge([*ran("p", 1, 10, 0, 1, outcome="error")], acks, finals={"p": final("dead"), "c": final("cancelled")})
    assert v["fan_in"] == {"flows": 1, "ran": 0, "violations": 0, "examples": []}


CRON: Row = {"cron_task": "tick", "cron_period": 10.0}


def key(second: int) -> str:
    return f"cron:beat:2026-01-01T00:{second // 60:02d}:{second % 60:02d}Z"


def test_cron_each_tick_runs_once() -> None:
    finals = {f"k{s}": final(task="tick", key=key(s)) for s in (0, 10, 20)}
    journal = [line for s in (0, 10, 20) for line in ran(f"k{s}", 1, 10, s, s + 1, task="tick", key=key(s))]
    v = judge(journal, finals=finals, config=CRON)
    assert v["cron"] == {
        "ticks": 3,
        "ran_once": 3,
        "reran_after_kill": 0,
        "duplicates": 0,
        "duplicate_keys": [],
        "never_ran": 0,
        "succeeded_without_run": 0,
        "pending_at_stop": 0,
        "off_grid": 0,
        "gaps": 0,
    }
    assert (v["ticks"], v["ok"]) == (3, True)
    twice = [*journal, *ran("k10", 2, 11, 12, 13, task="tick", key=key(10))]
    v = judge(twice, finals=finals, config=CRON)
    assert (v["cron"]["duplicates"], v["cron"]["duplicate_keys"], v["over_run"], v["ok"]) == (1, [key(10)], 1, False)
    assert judge(twice, finals=finals, config={**CRON, "cron_max_attempts": 2})["over_run"] == 0
    # The first run killed right after its end: its success may never have reached the store.
    v = judge(twice, events=[ev("kill", 11.5, pid=10)], finals=finals, config=CRON)
    assert (v["cron"]["duplicates"], v["cron"]["ran_once"], v["cron"]["reran_after_kill"], v["ok"]) == (0, 2, 1, True)
    # A tick whose only ok end a kill excuses still ran (the store says succeeded): once, not never.
    v = judge(journal, events=[ev("kill", 11.5, pid=10)], finals=finals, config=CRON)
    assert (v["cron"]["ran_once"], v["cron"]["never_ran"], v["cron"]["succeeded_without_run"]) == (3, 0, 0)
    # Two jobs for one tick's key, both run: a duplicate too.
    other = [*journal, *ran("x", 1, 11, 12, 13, task="tick", key=key(10))]
    v = judge(other, finals={**finals, "x": final(task="tick", key=key(10))}, config={**CRON, "cron_max_attempts": 1})
    assert (v["cron"]["duplicates"], v["cron"]["ticks"], v["ticks"], v["succeeded_twice"], v["ok"]) == (
        1,
        3,
        4,
        0,
        False,
    )


def test_cron_never_ran_succeeded_without_run_and_gaps() -> None:
    finals = {f"k{s}": final(task="tick", key=key(s)) for s in (0, 10, 40)}
    finals["k40"] = final("dead", task="tick", key=key(40))
    journal = [
        *ran("k0", 1, 10, 0, 1, task="tick", key=key(0)),
        *ran("k40", 1, 10, 40, 41, "error", task="tick", key=key(40)),
    ]
    v = judge(journal, finals=finals, config=CRON)
    assert (v["cron"]["never_ran"], v["cron"]["succeeded_without_run"], v["cron"]["gaps"]) == (1, 1, 2)
    assert v["ok"] is False  # k10 succeeded in the store, never in the journal
    journal += ran("k10", 1, 10, 10, 11, task="tick", key=key(10))
    v = judge(journal, finals=finals, config=CRON)
    assert (v["cron"]["never_ran"], v["cron"]["succeeded_without_run"], v["cron"]["gaps"], v["ok"]) == (0, 0, 2, True)
    assert judge(journal, finals=finals, config={"cron_task": "tick"})["cron"]["gaps"] is None


def test_drain_needs_both_events() -> None:
    assert judge(events=[ev("chaos_end", 1), ev("drained", 4)])["drain_s"] == 3.0
    assert judge(events=[ev("chaos_end", 1)])["drain_s"] is None


def test_load_journal_skips_and_counts_a_torn_last_line(tmp_path: Path) -> None:
    whole = '{"ev":"start","job":"a","task":"t","attempt":1,"epoch":1,"pid":10,"t":1.0}\n'
    (tmp_path / "10.jsonl").write_text(
        whole + "\n" + whole.replace("start", "end")[:-1].replace("}", ',"outcome":"ok"}')
    )
    (tmp_path / "11.jsonl").write_bytes(
        whole.replace('"pid":10', '"pid":11').encode() + b'{"ev":"end","job":"a","t":2.\xc3'
    )
    (tmp_path / "notes.txt").write_text("not a journal\n")
    lines, torn = verdict.load_journal(tmp_path)
    assert (len(lines), torn) == (3, 1)
    assert [line["pid"] for line in lines] == [10, 10, 11]
    (tmp_path / "11.jsonl").write_text(whole)
    assert verdict.load_journal(tmp_path)[1] == 0
    assert verdict.load_journal(tmp_path / "missing") == ([], 0)


def test_load_jsonl_is_strict(tmp_path: Path) -> None:
    path = tmp_path / "acks.jsonl"
    path.write_text('{"job": "a"}\n\n{"job": "b"}\n')
    assert verdict.load_jsonl(path) == [{"job": "a"}, {"job": "b"}]
    path.write_text('{"job": "a"}\n{"job": \n')
    with pytest.raises(ValueError, match=r"acks\.jsonl:2"):
        verdict.load_jsonl(path)


def test_summary_table_lines_up_the_headline_figures() -> None:
    config = {
        **LIMIT,
        **RATE,
        "task_limits": {"lim": ["m"], "rt": ["r"]},
        "limits": {**LIMIT["limits"], **RATE["limits"]},
    }
    v = judge([*ran("a", 1, 10, 0, 1, task="lim")], [ack("a", "lim")], config=config)
    table = verdict.summary_table(v)
    rows = [line.split("  ", 1)[0].strip() for line in table.splitlines()]
    assert rows[0] == "verdict" and "limit m peak / max" in rows and "rate r excess (strict)" in rows
    assert table.splitlines()[0].split()[-1] == "OK"
    width = max(len(label) for label in rows)
    assert all(line[width : width + 2] == "  " and line[width + 2] != " " for line in table.splitlines())
    assert verdict.summary_table(judge(acks=[ack("a")], finals={})).splitlines()[0].split()[-1] == "FAIL"


def test_end_lines_pair_with_their_start_by_job_epoch_and_pid() -> None:
    journal = [start("a", 1, 10, 0), end("a", 1, 11, 1), end("b", 1, 10, 1)]
    v = judge(journal, [ack("a")], [ev("kill", 2, pid=10)])
    assert (v["unmatched_ends"], v["orphaned"], v["interrupted"]) == (2, 1, 1)
    v = judge([*ran("a", 1, 10, 0, 1), end("a", 1, 10, 1.5)], [ack("a")])  # one end too many for its start
    assert (v["unmatched_ends"], v["succeeded_twice"]) == (1, 0)
    v = judge([start("a", 1, 10, 0), end("a", 1, 10, 1)], [ack("a")], [ev("kill", 2, pid=10)])
    assert (v["unmatched_ends"], v["orphaned"]) == (0, 0)


def test_the_store_must_match_the_journal() -> None:
    journal = [*ran("a", 1, 10, 0, 1, outcome="error"), *ran("a", 2, 10, 2, 3)]
    acks = [ack("a", max_attempts=2)]
    ok = {"a": {**final(), "epoch": 2}}
    assert (judge(journal, acks, finals=ok)["store_mismatch"], judge(journal, acks, finals=ok)["ok"]) == (0, True)
    # The store took epoch 1's outcome as a success: no ok end under epoch 1.
    v = judge(journal, acks, finals={"a": {**final(), "epoch": 1}})
    assert (v["store_mismatch"], v["store_mismatch_examples"], v["ok"]) == (1, [["a", "t", "succeeded", 1]], False)
    # Succeeded with no ok end at all (no epoch known): a success no execution produced.
    v = judge(journal[:2], [ack("a", max_attempts=2, expect="any")], finals={"a": final()})
    assert (v["store_mismatch"], v["ok"]) == (1, False)
    # Dead: an error end under the final epoch.
    dead = {"a": {**final("dead"), "epoch": 1}}
    assert judge(journal[:2], [ack("a", max_attempts=2, expect="dead")], finals=dead)["store_mismatch"] == 0
    dead = {"a": {**final("dead"), "epoch": 2}}
    assert judge(journal, [ack("a", max_attempts=2, expect="dead")], finals=dead)["store_mismatch"] == 1


def test_jobs_no_enqueue_answered_for_and_shared_keys_fail() -> None:
    journal = [*ran("a", 1, 10, 0, 1), *ran("b", 1, 10, 2, 3)]
    finals = {"a": final(key="k1"), "b": final(key="k2")}
    assert judge(journal, [ack("a"), ack("b")], finals=finals)["ok"] is True
    v = judge(journal, [ack("a")], finals=finals)  # b: a resent enqueue that made a second job
    assert (v["unacked_jobs"], v["unacked_ids"], v["ok"]) == (1, ["b"], False)
    v = judge(journal, [ack("a"), ack("b")], finals={"a": final(key="k1"), "b": final(key="k1")})
    assert (v["duplicate_keys"], v["ok"]) == (1, False)


def test_cron_ticks_off_the_grid_fail_and_pending_ones_do_not() -> None:
    finals = {f"k{s}": final(task="tick", key=key(s)) for s in (0, 10)}
    journal = [line for s in (0, 10) for line in ran(f"k{s}", 1, 10, s, s + 1, task="tick", key=key(s))]
    finals["k20"] = final("ready", task="tick", key=key(20))  # due after the drain: never claimed
    v = judge(journal, finals=finals, config=CRON)
    assert (v["cron"]["pending_at_stop"], v["cron"]["never_ran"], v["ok"]) == (1, 0, True)
    finals["k9"] = final(task="tick", key=key(9))
    journal += ran("k9", 1, 10, 9, 9.5, task="tick", key=key(9))
    v = judge(journal, finals=finals, config=CRON)
    assert (v["cron"]["off_grid"], v["ok"]) == (1, False)
