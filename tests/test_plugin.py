"""The pytest_trioq plugin as its users meet it: inner test files run through pytester.

Each inner file defines its own small registry (``PRELUDE``) and uses the
plugin's fixtures with pytest-trio's ``autojump_clock``. The outer tests are
plain sync tests: they only run pytest and read its outcome and output.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import pytest_trioq

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Pinned config for every inner run: pytester's directory is outside the
# project, so nothing of pyproject.toml applies unless written here.
INI = """
[pytest]
addopts = --strict-markers
filterwarnings = error
"""
TRIO_MODE_INI = INI + "trio_mode = true\n"

PRELUDE = """\
import time

import pytest
import trio

import trioq
from trioq.testing import SimulatedCrash, assert_all_terminal, crash_points

registry = trioq.Registry()
started = []  # virtual start time of each handler run of "t"


@registry.task(timeout=5.0, backoff=trioq.Backoff(base=0.1, jitter=0))
async def t(ctx):
    started.append(trio.current_time())
    return "ok"


@registry.task(timeout=30.0, backoff=trioq.Backoff(base=0.1, jitter=0))
async def slow(ctx):
    return "ok"


@registry.task(backoff=trioq.Backoff(base=0.1, jitter=0))
async def unbounded(ctx):  # no timeout, no heartbeat_timeout: a hang would never end
    return "ok"


"""


def inner(body: str) -> str:
    """An inner test module: the prelude's registry, then ``body``."""
    return PRELUDE + textwrap.dedent(body)


def run(pytester: pytest.Pytester, body: str, *args: str, ini: str = INI) -> pytest.RunResult:
    pytester.makeini(ini)
    pytester.makepyfile(test_inner=inner(body))
    return pytester.runpytest(*args)


# ------------------------------------------------------------------ faults


def test_fail_then_succeed(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        @pytest.mark.trio
        async def test_retried(trioq_faults, trioq_open_queue, autojump_clock):
            trioq_faults.fail("t", times=2)
            async with trioq_open_queue(registry) as queue:
                job = await queue.enqueue("t")
                done = await queue.wait(job.id)
            assert (done.state, done.attempts, done.result) == ("succeeded", 3, "ok")
            assert len(started) == 1  # the two failed attempts never ran the handler
            assert [str(fault) for fault in trioq_faults.injected] == [
                f"fail before the handler: task 't', job 1, attempt {n} "
                "(InjectedFailure: injected failure instead of running the handler)"
                for n in (1, 2)
            ]
        """,
    )
    result.assert_outcomes(passed=1)


def test_hang_is_detected_in_virtual_time(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        @pytest.mark.trio
        async def test_hang(trioq_faults, trioq_open_queue, autojump_clock):
            trioq_faults.hang("slow", times=1)
            real, virtual = time.perf_counter(), trio.current_time()
            async with trioq_open_queue(registry) as queue:
                job = await queue.enqueue("slow")
                done = await queue.wait(job.id)
            assert (done.state, done.attempts) == ("succeeded", 2)
            assert [str(fault) for fault in trioq_faults.injected] == [
                "hang before the handler: task 'slow', job 1, attempt 1"
            ]
            # The hung attempt ran into its 30 s timeout on the virtual clock;
            # real time stays far below (any bound under 30 s proves the point).
            assert trio.current_time() - virtual >= 30.0
            assert time.perf_counter() - real < 3.0
        """,
    )
    result.assert_outcomes(passed=1)


def test_delay_starts_the_handler_later(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        @pytest.mark.trio
        async def test_delay(trioq_faults, trioq_open_queue, autojump_clock):
            trioq_faults.delay("t", 2.0)
            async with trioq_open_queue(registry) as queue:
                enqueued = trio.current_time()
                job = await queue.enqueue("t")
                done = await queue.wait(job.id)
            assert (done.state, done.attempts) == ("succeeded", 1)
            assert started == [pytest.approx(enqueued + 2.0)]
            assert [str(fault) for fault in trioq_faults.injected] == [
                "delay 2s before the handler: task 't', job 1, attempt 1"
            ]
        """,
    )
    result.assert_outcomes(passed=1)


def test_crash_then_recovery(pytester: pytest.Pytester) -> None:
    # Three jobs through a WALStore write 9 log records: crash after each.
    result = run(
        pytester,
        """
        @pytest.mark.trio
        @pytest.mark.parametrize("point", crash_points(9))
        async def test_crash(tmp_path, trioq_faults, trioq_open_queue, autojump_clock, point):
            trioq_faults.crash(after_records=point)
            acknowledged = []
            with pytest.raises(SimulatedCrash):
                async with trioq_open_queue(registry, store=trioq.WALStore(tmp_path, fsync="always")) as queue:
                    for _ in range(3):
                        acknowledged.append((await queue.enqueue("t")).id)
                    await queue.join()
            assert [str(fault) for fault in trioq_faults.injected] == [f"crash after log record {point}"]
            async with trioq_open_queue(registry, store=trioq.WALStore(tmp_path)) as queue:
                await queue.join()
                await assert_all_terminal(queue)
                for job_id in acknowledged:
                    assert (await queue.get(job_id)).state == "succeeded"


        @pytest.mark.trio
        async def test_no_crash_writes_nine_records(tmp_path, trioq_faults, trioq_open_queue, autojump_clock):
            async with trioq_open_queue(registry, store=trioq.WALStore(tmp_path, fsync="always")) as queue:
                for _ in range(3):
                    await queue.enqueue("t")
                await queue.join()
            assert trioq_faults.records == 9
        """,
    )
    result.assert_outcomes(passed=10)


# ------------------------------------------------------------------ marker


def test_marker_fail(pytester: pytest.Pytester) -> None:
    # --strict-markers (in the ini's addopts): an unregistered marker would be a collection error.
    result = run(
        pytester,
        """
        @pytest.mark.trio
        @pytest.mark.trioq_faults(fail=1, task="t")
        async def test_marked(trioq_open_queue, autojump_clock):
            async with trioq_open_queue(registry) as queue:
                job = await queue.enqueue("t")
                done = await queue.wait(job.id)
            assert (done.state, done.attempts) == ("succeeded", 2)
        """,
        "--strict-markers",
    )
    result.assert_outcomes(passed=1)
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.trioq_faults(fail=None, hang=None, delay=None, task='*'*"])


def test_marker_hang_on_a_task_without_deadline(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        @pytest.mark.trio
        @pytest.mark.trioq_faults(hang=1, task="unbounded")
        async def test_would_hang(trioq_open_queue, autojump_clock):
            async with trioq_open_queue(registry) as queue:
                job = await queue.enqueue("unbounded")
                await queue.wait(job.id)
        """,
        "--strict-markers",
    )
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*ValueError: cannot inject a hang into task 'unbounded': it has no timeout and no heartbeat_timeout*"
            "the test would hang*",
        ]
    )


def test_marker_probabilities_match_fault_plan(pytester: pytest.Pytester) -> None:
    # FaultPlan takes prob from 0 to 1; the marker takes the same floats, 0 and False as off, and
    # says so when refused.
    result = run(
        pytester,
        """
        @pytest.mark.trio
        @pytest.mark.parametrize(
            "state, attempts",
            [
                pytest.param("succeeded", 1, marks=pytest.mark.trioq_faults(fail=0.0, task="t")),
                pytest.param("succeeded", 1, marks=pytest.mark.trioq_faults(fail=0, task="t")),
                pytest.param("succeeded", 1, marks=pytest.mark.trioq_faults(fail=False, task="t")),
                pytest.param("dead", 5, marks=pytest.mark.trioq_faults(fail=1.0, task="t")),
            ],
        )
        async def test_marked(state, attempts, trioq_open_queue, autojump_clock):
            async with trioq_open_queue(registry) as queue:
                job = await queue.enqueue("t")
                done = await queue.wait(job.id)
            assert (done.state, done.attempts) == (state, attempts)

        @pytest.mark.trio
        @pytest.mark.trioq_faults(hang=1.5)
        async def test_refused(trioq_open_queue, autojump_clock):
            pass
        """,
    )
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(["*trioq_faults(hang=1.5): give an int N >= 0*a float p in [[]0, 1] (each*"])


def test_marker_without_the_fixtures(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        @pytest.mark.trio
        @pytest.mark.trioq_faults(fail=1)
        async def test_unplugged(autojump_clock):
            async with trioq.open_queue(registry) as queue:
                job = await queue.enqueue("t")
                await queue.wait(job.id)
        """,
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_unplugged*",
            "test_inner.py::test_unplugged: the trioq_faults marker acts through the trioq_faults or "
            "trioq_open_queue fixture; request one of them*",
        ]
    )


# ------------------------------------------------------- trio_mode or not

BOTH_MODES = """
async def test_fixtures(trioq_faults, trioq_open_queue, autojump_clock):
    trioq_faults.fail("t", times=2)
    async with trioq_open_queue(registry) as queue:
        job = await queue.enqueue("t")
        assert (await queue.wait(job.id)).attempts == 3


@pytest.mark.trioq_faults(fail=1, task="t")
async def test_marker(trioq_open_queue, autojump_clock):
    async with trioq_open_queue(registry) as queue:
        job = await queue.enqueue("t")
        assert (await queue.wait(job.id)).attempts == 2
"""


def test_works_in_trio_mode(pytester: pytest.Pytester) -> None:
    run(pytester, BOTH_MODES, ini=TRIO_MODE_INI).assert_outcomes(passed=2)


def test_works_with_the_trio_marker(pytester: pytest.Pytester) -> None:
    run(pytester, "pytestmark = pytest.mark.trio\n" + BOTH_MODES).assert_outcomes(passed=2)
    # Control: with neither trio_mode nor the marker, nothing runs these async tests.
    result = run(pytester, BOTH_MODES)
    assert result.parseoutcomes().get("passed", 0) == 0


# ------------------------------------------------------------ the report

REPORT = """
async def flaky(trioq_faults, trioq_open_queue, workers):
    trioq_faults.fail("t", prob=0.5)
    async with trioq_open_queue(registry, workers=workers) as queue:
        for _ in range(20):
            await queue.enqueue("t")
        await queue.join()
        await assert_all_terminal(queue)


@pytest.mark.trio
async def test_one_worker(trioq_faults, trioq_open_queue, autojump_clock):
    await flaky(trioq_faults, trioq_open_queue, 1)
    assert False


@pytest.mark.trio
async def test_four_workers(trioq_faults, trioq_open_queue, autojump_clock):
    await flaky(trioq_faults, trioq_open_queue, 4)
    assert False


@pytest.mark.trio
async def test_passes(trioq_faults, trioq_open_queue, autojump_clock):
    await flaky(trioq_faults, trioq_open_queue, 4)
"""

FAULT_LINE = re.compile(
    r"fail before the handler: task 't', job \d+, attempt \d+ "
    r"\(InjectedFailure: injected failure instead of running the handler\)"
)


def fault_sections(result: pytest.RunResult) -> dict[str, tuple[int, list[str]]]:
    """Every "trioq faults" report section: node id -> (seed, injected-fault lines).

    Checks the section's layout on the way.
    """
    sections: dict[str, tuple[int, list[str]]] = {}
    lines = result.outlines
    for start, line in enumerate(lines):
        if not re.fullmatch(r"-+ trioq faults -+", line):
            continue
        body = []
        for follow in lines[start + 1 :]:
            if follow.startswith(("___", "===")) or re.fullmatch(r"-+ .* -+", follow):
                break
            body.append(follow)
        seed = re.fullmatch(r"seed: (\d+)", body[0])
        replay = re.fullmatch(r"replay: pytest (\S+) --trioq-seed=(\d+)", body[1])
        count = re.fullmatch(r"injected faults \((\d+)\):", body[3])
        assert seed and replay and count, body
        assert int(replay[2]) == int(seed[1])
        assert body[2] == f"plan: <FaultPlan seed={seed[1]} [fail('t', when='before', prob=0.5)]>"
        faults = [fault.removeprefix("  ") for fault in body[4:]]
        assert len(faults) == int(count[1]) > 0, body
        assert all(FAULT_LINE.fullmatch(fault) for fault in faults), faults
        sections[replay[1]] = (int(seed[1]), faults)
    return sections


def test_failure_report_names_the_seed_and_replays(pytester: pytest.Pytester) -> None:
    one, four = "test_inner.py::test_one_worker", "test_inner.py::test_four_workers"
    result = run(pytester, REPORT)
    result.assert_outcomes(passed=1, failed=2)
    sections = fault_sections(result)
    assert sorted(sections) == sorted([one, four])  # the passing test gets no section
    seed_one, faults_one = sections[one]
    seed_four, faults_four = sections[four]
    # The default seed is derived from the node id.
    assert (seed_one, seed_four) == (pytest_trioq.seed_for(one), pytest_trioq.seed_for(four))
    assert seed_one != seed_four
    result.stdout.fnmatch_lines(
        ["*- trioq faults -*", f"seed: {seed_one}", f"replay: pytest {one} --trioq-seed={seed_one}"]
    )

    # The replay option injects the same faults: in the same order with one worker...
    replay = pytester.runpytest(one, f"--trioq-seed={seed_one}")
    replay.assert_outcomes(failed=1)
    assert fault_sections(replay) == {one: (seed_one, faults_one)}
    # ... the same set with four.
    replay = pytester.runpytest(four, f"--trioq-seed={seed_four}")
    replay.assert_outcomes(failed=1)
    (seed, faults), *_ = fault_sections(replay).values()
    assert (seed, sorted(faults)) == (seed_four, sorted(faults_four))

    # Another seed, other faults.
    other = pytester.runpytest(one, f"--trioq-seed={seed_one + 1}")
    other.assert_outcomes(failed=1)
    (seed, faults), *_ = fault_sections(other).values()
    assert seed == seed_one + 1
    assert faults != faults_one


# ------------------------------------------------------------ load cost


def test_importing_the_plugin_imports_no_app_code() -> None:
    code = "import sys, pytest_trioq; print(sorted(m for m in ('quart', 'hypercorn', 'trioq') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


def test_a_run_that_does_not_use_the_plugin_stays_light(pytester: pytest.Pytester) -> None:
    # Holds for the whole process, other installed plugins (schemathesis,
    # hypothesis, anyio) included: none of them imports quart or hypercorn,
    # and only pytest_trioq's fixtures would import trioq.
    pytester.makeini(INI)
    pytester.makepyfile(
        """
        import sys

        def test_light():
            assert "pytest_trioq" in sys.modules  # the plugin is loaded...
            loaded = [m for m in ("quart", "hypercorn", "trioq") if m in sys.modules]
            assert loaded == []  # ... and pulled in none of these
        """
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["plugins:*trioq-*"])


# ------------------------------------------------------------ the example


def test_shop_example_passes(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini(INI)
    package = pytester.mkpydir("shop")
    for module in sorted((EXAMPLES / "shop").glob("*.py")):
        (package / module.name).write_text(module.read_text())
    pytester.makepyfile(test_shop=(EXAMPLES / "test_shop.py").read_text())
    # The copy, not a `shop` package another test of this session imported already (in-process runs
    # share sys.modules).
    for name in [m for m in sys.modules if m == "shop" or m.startswith("shop.")]:
        monkeypatch.delitem(sys.modules, name)
    result = pytester.runpytest()
    result.assert_outcomes(passed=36)
