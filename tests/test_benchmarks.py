"""The peer benchmark harness (benchmarks/peers/run.py): its verdicts, and a run over trioq alone.

The peers themselves need Redis and PostgreSQL (benchmarks/peers/setup.sh), which the test
suite does not start; the harness and the trioq adapter are checked here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "benchmarks" / "peers" / "run.py"


def load_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_run", RUN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fig(median: float) -> dict[str, float]:
    return {"median": median, "min": median, "max": median, "n": 1}


def test_targets_compare_the_medians() -> None:
    run = load_run()
    summary = {
        ("trioq", "memory"): {"drain_per_s": fig(100_000), "p50_ms": fig(0.05), "sleep16_efficiency": fig(0.95)},
        ("trioq", "wal-always"): {"drain_per_s": fig(80_000), "p50_ms": fig(0.4), "sleep16_efficiency": fig(0.96)},
        ("saq", "default"): {"drain_per_s": fig(1_000), "p50_ms": fig(0.5), "sleep16_efficiency": fig(0.8)},
        ("dramatiq", "default"): {"drain_per_s": fig(10_001), "p50_ms": fig(5.0), "sleep16_efficiency": fig(0.97)},
    }
    line = run.targets(summary)
    assert line["wal_always_drain_vs_best_peer"] == 8.0  # 80,000 / 10,001 rounds to 8.0 ...
    assert line["drain_target_met"] is False  # ... but is below 8x
    assert line["p50_memory_times_lower_than_best_peer"] == 10.0
    assert line["latency_target_met"] is False  # judged on WAL "always": 0.5 / 0.4
    assert (line["sleep16_efficiency_best_peer"], line["sleep16_efficiency_trioq_min"]) == (0.97, 0.95)
    assert line["sleep16_efficiency_target_met"] is False
    table = run.markdown(summary, 1)
    assert "| trioq memory | embedded, MemoryStore | 100,000 (100,000-100,000) |" in table


@pytest.mark.slow
def test_the_harness_runs_trioq_end_to_end() -> None:
    proc = subprocess.run(
        # Two embedded variants, the fastest and the durable one: the postgres one needs setup.sh's
        # server, and wal-never runs the same adapter code as wal-always.
        [
            sys.executable,
            str(RUN),
            "--libs",
            "trioq",
            "--variants",
            "memory,wal-always",
            "--quick",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["section"] == "env" and lines[0]["quick"] is True
    measured = [line for line in lines if line["section"] == "peers"]
    assert len(measured) == 2 * 4  # two stores, four workloads
    assert not [line for line in measured if "error" in line]
    summaries = {line["variant"]: line for line in lines if line["section"] == "summary"}
    assert set(summaries) == {"memory", "wal-always"}
    for line in summaries.values():
        assert line["drain_per_s"]["median"] > 0 and 0 < line["sleep64_efficiency"]["median"] <= 1.05
    assert lines[-1]["section"] == "targets"
    assert "| library | setup | no-op drain jobs/s |" in proc.stderr
