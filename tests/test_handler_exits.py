"""A handler's own exit (SystemExit, KeyboardInterrupt, any BaseException) fails its
attempt; only a real signal to this process stops the queue."""

from __future__ import annotations

import argparse
import functools
import gc
import signal
import subprocess
import sys
import textwrap
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import trioq
from trioq import Backoff, JobState

from . import handlers
from ._sigint import default_sigint
from .test_serve import AUTH, Server

NO_WAIT = Backoff(base=0.0, jitter=0.0)


class _Custom(BaseException):
    """A BaseException of the user's own."""


def _sys_exit(ctx: Any) -> None:
    sys.exit(0)


def _argparse_error(ctx: Any) -> None:
    argparse.ArgumentParser(prog="wrapped-cli").parse_args(["--no-such-flag"])


def _interrupt(ctx: Any) -> None:
    raise KeyboardInterrupt


def _custom(ctx: Any) -> None:
    raise _Custom("mine")


_EXITS: dict[str, tuple[Callable[[Any], None], str]] = {
    "sys.exit": (_sys_exit, "SystemExit: the handler called sys.exit(0)"),
    "argparse": (_argparse_error, "SystemExit: the handler called sys.exit(2)"),
    "KeyboardInterrupt": (_interrupt, "KeyboardInterrupt: the handler raised KeyboardInterrupt itself"),
    "BaseException": (_custom, "_Custom: mine"),
}


async def _run_exiting(registry: trioq.Registry, task: str) -> tuple[trioq.Job, trioq.Job]:
    """Run a job of ``task`` (two attempts), then a plain job: both through one open queue."""

    @registry.task
    async def after(ctx: trioq.JobContext) -> str:
        return "still serving"

    async with trioq.open_queue(registry, workers=1) as queue:
        job = await queue.enqueue(task)
        with trio.fail_after(30):
            exited = await queue.wait(job.id)
            later = await queue.wait((await queue.enqueue("after")).id)
        stats = await queue.stats()
    assert stats["workers"]["healthy"] == 1 and stats["totals"]["failed_attempts"] == 2
    return exited, later


@pytest.mark.parametrize("kind", ["async", "thread"])
@pytest.mark.parametrize("how", sorted(_EXITS))
async def test_a_handlers_own_exit_fails_its_attempt_and_the_queue_goes_on(
    kind: str, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fn, error = _EXITS[how]
    registry = trioq.Registry()

    async def async_fn(ctx: Any) -> None:
        fn(ctx)

    registry.add(async_fn if kind == "async" else fn, name="exits", kind=kind, max_attempts=2, backoff=NO_WAIT)
    exited, later = await _run_exiting(registry, "exits")
    assert (exited.state, exited.attempts) == (JobState.DEAD, 2)  # both attempts counted
    assert exited.error is not None and exited.error.startswith(error), exited.error
    assert later.result == "still serving"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fn", "error"),
    [(handlers.exit_zero, "SystemExit: the handler called sys.exit(0)"), (handlers.interrupt, "KeyboardInterrupt")],
    ids=["sys.exit", "KeyboardInterrupt"],
)
async def test_a_process_handlers_exit_fails_its_attempt_and_the_queue_goes_on(
    fn: Callable[[Any], None], error: str
) -> None:
    registry = trioq.Registry()
    registry.add(fn, name="exits", kind="process", max_attempts=2, backoff=NO_WAIT)
    exited, later = await _run_exiting(registry, "exits")
    assert (exited.state, exited.attempts) == (JobState.DEAD, 2)
    assert exited.error is not None and exited.error.startswith(error), exited.error
    assert later.result == "still serving"


_SIGINT_SCRIPT = textwrap.dedent(
    """
    import sys, time, trio, trioq

    registry = trioq.Registry()

    @registry.task
    async def busy(ctx):
        print("STARTED", flush=True)
        end = time.monotonic() + 20
        while time.monotonic() < end:  # sync code with no checkpoint: the signal lands here
            pass

    async def main():
        async with trioq.open_queue(registry, store=trioq.WALStore(sys.argv[1]), workers=1) as queue:
            await queue.enqueue("busy")
            await trio.sleep(30)

    trio.run(main)
    """
)


@pytest.mark.slow
def test_a_real_sigint_landing_in_a_handler_stops_the_queue_uncounted(tmp_path: Path) -> None:
    script = tmp_path / "busy.py"
    script.write_text(_SIGINT_SCRIPT)
    wal = tmp_path / "wal"
    child = subprocess.Popen(
        [sys.executable, str(script), str(wal)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,  # only signal calls between fork and exec
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "STARTED"
        time.sleep(0.2)  # well inside the busy loop
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
    assert child.returncode != 0
    assert stderr.rstrip().endswith("KeyboardInterrupt"), stderr

    async def reopen() -> trioq.Job:
        async with trioq.open_queue(trioq.Registry(), store=trioq.WALStore(wal), workers=0) as queue:
            (job,) = await queue.store.jobs([JobState.READY])
            return job

    job = trio.run(reopen)
    assert (job.attempts, job.error) == (0, None)  # cut off by the signal: not an attempt


@pytest.mark.slow
def test_trioq_serve_keeps_serving_when_a_handler_calls_sys_exit(tmp_path: Path) -> None:
    served = Server(tmp_path / "wal", "--app", "tests.exiting_app:registry")
    try:
        with httpx.Client(base_url=served.url, headers=AUTH, timeout=5) as client:
            job_id = client.post("/jobs", json={"task": "quits"}).json()["id"]
            deadline = time.monotonic() + 10
            while (job := client.get(f"/jobs/{job_id}").json())["state"] != "dead":
                assert time.monotonic() < deadline, job
                time.sleep(0.02)
            assert job["attempts"] == 2 and job["error"].startswith("SystemExit")
            assert client.get("/healthz").status_code == 200
            assert served.process.poll() is None  # the server is still up
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(timeout=15)
        assert served.process.returncode == 0
    finally:
        served.kill()


async def test_a_shutdown_cancel_wrapped_in_a_handlers_nursery_still_releases_the_job(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # trio wraps the Cancelled leaving a handler's nursery in a group, which an
    # `except trio.Cancelled` in the worker once missed: no release was recorded.
    registry = trioq.Registry()
    started = trio.Event()

    @registry.task
    async def fans_out(ctx: trioq.JobContext) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            started.set()
            await trio.sleep_forever()

    async with trioq.open_queue(registry, workers=1, shutdown_grace=0) as queue:
        job = await queue.enqueue("fans_out")
        await started.wait()
    assert queue._totals.released == 1
    async with trioq.open_queue(registry, store=queue.store, workers=0) as reopened:
        back = await reopened.get(job.id)
    assert (back.state, back.attempts) == (JobState.READY, 0)


# ------------------------------------------------ real signals, in this process


@pytest.fixture
def sigterm() -> Iterator[Callable[[Any], None]]:
    """Installs a SIGTERM handler for the test (``sigterm(handler)``), and puts the old one back."""
    old = signal.getsignal(signal.SIGTERM)
    try:
        yield lambda handler: signal.signal(signal.SIGTERM, handler)
    finally:
        signal.signal(signal.SIGTERM, old)


def _exit_on_signal(code: int, signum: int, frame: Any) -> None:
    sys.exit(code)


class _ExitOnSignal:
    def __call__(self, signum: int, frame: Any) -> None:
        raise SystemExit(143)


def _exit_once(signum: int, frame: Any) -> None:
    signal.signal(signum, signal.SIG_DFL)
    raise SystemExit(0)


def _signalled_registry(after: Callable[[], None] | None = None) -> trioq.Registry:
    registry = trioq.Registry()

    # One attempt: a regression that takes the signal for the job's own exit
    # must not send it again (the one-shot handler put SIG_DFL back: it would
    # end the test process).
    @registry.task(max_attempts=1, backoff=NO_WAIT)
    async def signalled(ctx: trioq.JobContext) -> None:
        try:
            signal.raise_signal(signal.SIGTERM)  # a real signal to this process, landing here
        finally:
            if after is not None:
                after()

    return registry


@pytest.mark.parametrize(
    ("handler", "raised"),
    [
        (functools.partial(_exit_on_signal, 143), SystemExit),
        (_ExitOnSignal(), SystemExit),
        (signal.default_int_handler, KeyboardInterrupt),  # SIGTERM routed to Ctrl-C's C handler
        (lambda *_: sys.exit(0), SystemExit),  # the frame is inside *args
        (_exit_once, SystemExit),  # puts the default back before it raises
    ],
    ids=["partial", "callable-object", "default_int_handler", "varargs-lambda", "one-shot"],
)
async def test_a_real_signal_stops_the_queue_whatever_its_handler_is(
    sigterm: Callable[[Any], None], handler: Any, raised: type[BaseException], autojump_clock: trio.testing.MockClock
) -> None:
    sigterm(handler)
    store = trioq.MemoryStore()
    with pytest.raises(raised):
        async with trioq.open_queue(_signalled_registry(), store=store, workers=1) as queue:
            job = await queue.enqueue("signalled")
            await trio.sleep(10)
    async with trioq.open_queue(trioq.Registry(), store=store, workers=0) as queue:
        back = await queue.get(job.id)
    assert (back.state, back.attempts) == (JobState.READY, 0)  # cut off by the signal: not counted


async def test_a_signal_behind_a_failing_cleanup_still_stops_the_queue(
    sigterm: Callable[[Any], None], autojump_clock: trio.testing.MockClock
) -> None:
    def cleanup_fails() -> None:
        raise RuntimeError("cleanup failed")

    sigterm(signal.default_int_handler)
    with pytest.raises(KeyboardInterrupt):
        async with trioq.open_queue(_signalled_registry(cleanup_fails), workers=1) as queue:
            await queue.enqueue("signalled")
            await trio.sleep(10)


async def test_a_job_calling_the_programs_signal_handler_itself_fails_its_attempt(
    sigterm: Callable[[Any], None], autojump_clock: trio.testing.MockClock
) -> None:
    # Shared "give up" code: the job calls the handler function; no signal arrived.
    def give_up(signum: int, frame: Any) -> None:
        sys.exit(3)

    sigterm(give_up)
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def gives_up(ctx: trioq.JobContext) -> None:
        give_up(signal.SIGTERM, None)

    async with trioq.open_queue(registry, workers=1) as queue:
        done = await queue.wait((await queue.enqueue("gives_up")).id)
    assert done.state is JobState.DEAD and done.error is not None and done.error.startswith("SystemExit")


async def test_an_exit_in_a_handlers_own_nursery_says_what_happened(autojump_clock: trio.testing.MockClock) -> None:
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def fans_out(ctx: trioq.JobContext) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            nursery.start_soon(_async_exit)

    async with trioq.open_queue(registry, workers=1) as queue:
        done = await queue.wait((await queue.enqueue("fans_out")).id)
    assert done.error is not None and done.error.startswith("SystemExit: the handler called sys.exit(4)")


async def _async_exit() -> None:
    sys.exit(4)


async def test_a_failed_attempt_keeps_nothing_alive(autojump_clock: trio.testing.MockClock) -> None:
    # The worker once kept the handler's exception in a local of its frame: a
    # cycle through the traceback that held every failed attempt's frames (and
    # the handler's locals) until the cyclic GC ran.
    registry = trioq.Registry()
    raised: list[weakref.ref[object]] = []

    def tracked(exc: BaseException) -> BaseException:
        raised.append(weakref.ref(exc))
        return exc

    @registry.task(max_attempts=1)
    async def fails(ctx: trioq.JobContext, how: str) -> None:
        held = _Held()  # a local of the handler's frame, which the traceback holds
        raised.append(weakref.ref(held))
        raise tracked(_TrackedError("no") if how == "error" else _TrackedExit(1))

    gc.disable()
    try:
        async with trioq.open_queue(registry, workers=2) as queue:
            for how in ("error", "exit"):
                await queue.wait((await queue.enqueue("fails", {"how": how})).id)
        assert len(raised) == 4 and [ref() for ref in raised] == [None] * 4
    finally:
        gc.enable()


class _TrackedError(ValueError):
    """A ValueError that can be weakly referenced."""


class _TrackedExit(SystemExit):
    """A SystemExit that can be weakly referenced."""


class _Held:
    """Something a handler holds."""


async def _in_a_child_whose_cleanup_fails() -> None:
    async def child() -> None:
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            raise RuntimeError("the child's cleanup failed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(child)


async def _exit_130() -> None:
    try:
        signal.raise_signal(signal.SIGTERM)
    except KeyboardInterrupt:
        sys.exit(130)  # the common CLI idiom


async def _reraised_from_none() -> None:
    try:
        signal.raise_signal(signal.SIGTERM)
    except KeyboardInterrupt:
        raise KeyboardInterrupt("interrupted") from None


async def _as_a_cause() -> None:
    try:
        signal.raise_signal(signal.SIGTERM)
    except KeyboardInterrupt as interrupt:
        saved = interrupt
    raise RuntimeError("stopped") from saved


@pytest.mark.parametrize(
    "shape",
    [_in_a_child_whose_cleanup_fails, _exit_130, _reraised_from_none, _as_a_cause],
    ids=["nursery-cleanup-fails", "exit-130", "from-none", "as-a-cause"],
)
async def test_a_real_signal_behind_what_the_handler_made_of_it_stops_the_queue(
    sigterm: Callable[[Any], None], shape: Callable[[], Any], autojump_clock: trio.testing.MockClock
) -> None:
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    sigterm(interrupt)
    registry = trioq.Registry()

    @registry.task(max_attempts=1, backoff=NO_WAIT)
    async def shaped(ctx: trioq.JobContext) -> None:
        await shape()

    with pytest.raises(KeyboardInterrupt):
        async with trioq.open_queue(registry, workers=1) as queue:
            await queue.enqueue("shaped")
            await trio.sleep(10)


@pytest.mark.parametrize("kind", ["thread", "process"])
async def test_a_thread_or_process_handlers_own_interrupt_fails_its_attempt_with_a_c_handler_installed(
    sigterm: Callable[[Any], None], kind: str
) -> None:
    # With SIGTERM routed to signal.default_int_handler, whose KeyboardInterrupt
    # comes from no raise instruction, a process handler's own (its traceback
    # rebuilt from a pickle) once looked like a signal and stopped the queue.
    sigterm(signal.default_int_handler)
    registry = trioq.Registry()
    registry.add(handlers.interrupt if kind == "process" else _interrupt, name="own", kind=kind, max_attempts=1)
    async with trioq.open_queue(registry, workers=1) as queue:
        with trio.fail_after(30):
            done = await queue.wait((await queue.enqueue("own")).id)
    assert done.state is JobState.DEAD and done.error is not None and done.error.startswith("KeyboardInterrupt")
