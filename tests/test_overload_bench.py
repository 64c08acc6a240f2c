"""The overload benchmark (benchmarks/overload.py): a one-seed run of every profile in virtual time, shortened.

Only the harness's invariants are asserted, none that depends on tuning: every offered task is
counted exactly once, every arm of a profile ran the same trace (one sha256, the one written),
the light-load profile is on time under every arm, and under a ``max=`` limit at or below the
dependency's capacity no call ran above it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def load_overload() -> ModuleType:
    """benchmarks/overload.py as a module (benchmarks/ on sys.path, as when it runs as a script)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("overload_bench", BENCHMARKS / "overload.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


overload = load_overload()
model = sys.modules["_overload_model"]

#: The traces' length here: shorter than ``--smoke``'s (``overload.SMOKE_SCALE``) to keep the suite
#: fast. Long enough for what is asserted below (profile 4's FIFO arm still fails attempts).
SCALE = 0.1


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """Every profile's lines for seed 1 at :data:`SCALE`, traces written to a temporary directory."""
    trace_dir = tmp_path_factory.mktemp("traces")
    out = {n: overload.run_profile(n, [1], scale=SCALE, trace_dir=trace_dir) for n in model.PROFILES}
    out[0] = [{"trace_dir": str(trace_dir)}]
    return out


def runs(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["section"] == "overload_run"]


@pytest.mark.parametrize("number", sorted(model.PROFILES))
def test_every_offered_task_is_counted_once(smoke: dict[int, list[dict[str, Any]]], number: int) -> None:
    measured = runs(smoke[number])
    assert measured
    for line in measured:
        counts = [line[outcome] for outcome in model.OUTCOMES]
        assert min(counts) >= 0
        assert sum(counts) == line["accounted"] == line["offered"] > 0, line["arm"]
        assert line["failed_attempts"] <= line["attempts"]


@pytest.mark.parametrize("number", sorted(model.PROFILES))
def test_every_arm_runs_the_same_trace(smoke: dict[int, list[dict[str, Any]]], number: int) -> None:
    profile = model.PROFILES[number].scaled(SCALE)
    trace = model.make_trace(profile, 1, SCALE)
    assert model.make_trace(profile, 1, SCALE) == trace  # a pure function of profile and seed
    written = model.load_trace(Path(smoke[0][0]["trace_dir"]) / f"p{number}-s1-x{SCALE:g}.json.gz")
    assert written.sha256 == trace.sha256 and written.tasks == trace.tasks
    assert {line["trace_sha256"] for line in runs(smoke[number])} == {trace.sha256}
    assert {line["offered"] for line in runs(smoke[number])} == {len(trace.tasks)}
    # Every arm of the profile is there: measured, or marked unavailable (never both, never missing).
    summaries = [line for line in smoke[number] if line["section"] == "overload"]
    assert [line["arm"] for line in summaries] == [arm.name for arm in profile.arms]
    for line in summaries:
        measured = [r for r in runs(smoke[number]) if r["arm"] == line["arm"]]
        assert bool(measured) != ("unavailable" in line)


def test_light_load_is_on_time_under_every_arm(smoke: dict[int, list[dict[str, Any]]]) -> None:
    for line in runs(smoke[1]):
        assert line["on_time_pct"] >= 99.0, line["arm"]
        assert line["above_capacity"] == 0


@pytest.mark.parametrize("number", sorted(model.PROFILES))
def test_no_call_above_capacity_under_a_max_limit(smoke: dict[int, list[dict[str, Any]]], number: int) -> None:
    profile = model.PROFILES[number]
    lowest = min(c for _, c in profile.capacity)
    arms = {arm.name: arm for arm in profile.arms}
    for line in runs(smoke[number]):
        arm = arms[line["arm"]]
        if isinstance(arm.limit, int):
            assert line["max_in_flight"] <= arm.limit, arm.name  # the limit held
            if arm.limit <= lowest:
                assert line["above_capacity"] == 0, arm.name


def test_a_run_repeats_itself() -> None:
    # The dependency's draws are keyed by task and attempt, backoff has no jitter, and trio's
    # scheduler RNG is seeded per run: the same trace gives the same figures, retries and all.
    profile = model.PROFILES[4].scaled(SCALE)
    trace = model.make_trace(profile, 2, SCALE)
    first, second = (overload.run_virtual(profile, model.FIFO, trace) for _ in range(2))
    assert first["failed_attempts"] > 0
    for line in (first, second):
        del line["wall_s"]
    assert first == second
