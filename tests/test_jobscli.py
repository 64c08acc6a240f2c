"""``trioq jobs list|show|retry|cancel`` on a WAL directory, a live server (--url) and PostgreSQL."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import trio

import trioq
from trioq._app.cli import main

from .test_client import TOKEN, live_server

pytestmark = pytest.mark.slow


def _registry() -> trioq.Registry:
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def fail(ctx: trioq.JobContext, n: int) -> None:
        raise RuntimeError(f"failed {n}")

    @registry.task
    async def ok(ctx: trioq.JobContext) -> str:
        return "fine"

    return registry


def run(*argv: str) -> str:
    """``trioq`` with ``argv``; its stdout (a failure raises SystemExit)."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def _fill(directory: Path) -> list[str]:
    """Three dead jobs and two succeeded ones in a WAL directory; their ids, oldest first."""

    async def fill() -> list[str]:
        async with trioq.open_queue(_registry(), store=trioq.WALStore(directory), workers=2) as queue:
            jobs = [await queue.enqueue("fail", {"n": n}) for n in range(3)]
            jobs += [await queue.enqueue("ok") for _ in range(2)]
            await queue.join()
            return [job.id for job in jobs]

    return trio.run(fill)


def test_list_show_retry_and_cancel_on_a_wal_directory(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    ids = _fill(directory)
    listed = json.loads(run("jobs", "list", "--wal", str(directory), "--json"))
    assert [job["id"] for job in listed] == ids[::-1]
    dead = json.loads(run("jobs", "list", "--wal", str(directory), "--state", "dead", "--limit", "2", "--json"))
    assert [job["id"] for job in dead] == [ids[2], ids[1]]
    table = run("jobs", "list", "--wal", str(directory), "--state", "dead", "--limit", "2")
    assert "RuntimeError: failed 2" in table and ids[2] in table and f"more: --after {ids[1]}" in table
    shown = run("jobs", "show", ids[0], "--wal", str(directory))
    assert "state: dead" in shown and "attempt 1 failed" in shown and 'raise RuntimeError(f"failed {n}")' in shown
    assert "retried 3 job(s)" in run("jobs", "retry", "--wal", str(directory), "--state", "dead")
    again = json.loads(run("jobs", "show", ids[1], "--wal", str(directory), "--json"))
    assert again["state"] == "ready" and again["attempts"] == 0
    cancelled = json.loads(run("jobs", "cancel", ids[1], "--wal", str(directory), "--json"))
    assert [job["state"] for job in cancelled] == ["cancelled"]
    with pytest.raises(SystemExit, match="--all"):  # "trioq jobs cancel $IDS" with $IDS empty
        main(["jobs", "cancel", "--wal", str(directory)])
    assert json.loads(run("jobs", "cancel", "--wal", str(directory), "--json", "--all")) == {"count": 2}


def test_clean_one_line_errors(tmp_path: Path) -> None:
    directory = tmp_path / "wal"
    ids = _fill(directory)
    for argv, message in [
        (["jobs", "list", "--wal", str(tmp_path / "nope")], "no WAL directory at"),
        (["jobs", "show", "no-such-job", "--wal", str(directory)], "no-such-job"),
        (["jobs", "list", "--url", "127.0.0.1:1"], "http:// or https://"),
        (["jobs", "list", "--url", "http://[::1"], "is not a valid address"),
        (["jobs", "list", "--url", "http://127.0.0.1:1", "--token", "\u00e9"], "printable ASCII"),
        (["jobs", "list", "--url", "http://127.0.0.1:1"], "cannot reach http://127.0.0.1:1"),
        (["jobs", "retry", ids[0], "--state", "dead", "--wal", str(directory)], "ids or filters"),
        (["jobs", "retry", "--wal", str(directory)], "or --all for every job"),
        (["jobs", "cancel", ids[0], "--all", "--wal", str(directory)], "ids or --all"),
        (["jobs", "list", "--limit", "0", "--wal", str(directory)], "limit must be"),
    ]:
        with pytest.raises(SystemExit) as excinfo:
            main(argv)
        text = str(excinfo.value.code)
        assert message in text and "\n" not in text and "Traceback" not in text, (argv, text)

    async def locked() -> None:
        async with trioq.open_queue(_registry(), store=trioq.WALStore(directory), workers=0):
            with pytest.raises(SystemExit, match=r"open by a running queue.*--url"):
                await trio.to_thread.run_sync(main, ["jobs", "retry", "--all", "--wal", str(directory)])
            # Reading works meanwhile: list and show replay the log read-only.
            await trio.to_thread.run_sync(main, ["jobs", "list", "--wal", str(directory)])

    trio.run(locked)


def test_acting_on_ids_goes_on_past_one_that_fails(tmp_path: Path) -> None:
    """``retry A B C`` with B not dead retries A and C, prints them, and fails naming B (exit 1): an
    operator is told what changed, not only what did not."""
    directory = tmp_path / "wal"
    ids = _fill(directory)  # three dead, two succeeded
    out = io.StringIO()
    with redirect_stdout(out), pytest.raises(SystemExit) as excinfo:
        main(["jobs", "retry", ids[0], ids[3], "no-such-job", ids[1], "--wal", str(directory), "--json"])
    message = str(excinfo.value.code)
    assert message.startswith("trioq jobs retry: 2 of 4 job(s) not retried: ") and "\n" not in message
    assert ids[3] in message and "no-such-job" in message and ids[0] not in message
    assert [job["id"] for job in json.loads(out.getvalue())] == [ids[0], ids[1]]
    shown = json.loads(run("jobs", "list", "--wal", str(directory), "--state", "ready", "--json"))
    assert sorted(job["id"] for job in shown) == sorted([ids[0], ids[1]])


def test_text_from_jobs_is_printed_as_text(tmp_path: Path) -> None:
    """An error, queue or tenant holding rich markup (``[/x]``, ``[bold]``) is shown as written, not read as
    markup (a closing tag that matches nothing was a MarkupError traceback); terminal control sequences in
    it (ESC) are shown escaped, never sent to the terminal."""
    directory = tmp_path / "wal"
    text = "bad path [/tmp/x] [bold]boom\x1b[31mRED\x07"
    registry = trioq.Registry()

    @registry.task(max_attempts=1)
    async def odd(ctx: trioq.JobContext) -> None:
        raise RuntimeError(text)

    async def fill() -> None:
        async with trioq.open_queue(registry, store=trioq.WALStore(directory), workers=1) as queue:
            await queue.enqueue("odd", queue="q[/x]", tenant="[/]")
            await queue.join()

    trio.run(fill)
    table = run("jobs", "list", "--wal", str(directory))
    (job,) = json.loads(run("jobs", "list", "--wal", str(directory), "--json"))
    shown = run("jobs", "show", job["id"], "--wal", str(directory))
    for out in (table, shown):
        assert "RuntimeError: bad path [/tmp/x] [bold]boom\\x1b[31mRED\\x07" in out, out
        assert "\x1b" not in out and "\x07" not in out
    assert "q[/x]" in table and "tenant: [/]" in shown


async def test_list_and_act_through_a_running_server() -> None:
    async with live_server() as (queue, url):
        dead = await queue.enqueue("fail")
        await queue.wait(dead.id)
        listed = await trio.to_thread.run_sync(run, "jobs", "list", "--url", url, "--token", TOKEN, "--json")
        assert [job["id"] for job in json.loads(listed)] == [dead.id]
        answer = await trio.to_thread.run_sync(run, "jobs", "retry", dead.id, "--url", url, "--token", TOKEN, "--json")
        assert json.loads(answer)[0]["attempts"] == 0
        with pytest.raises(SystemExit, match="bearer token"):
            await trio.to_thread.run_sync(main, ["jobs", "list", "--url", url, "--token", "wrong"])


def test_list_and_act_on_postgres(pg_dsn: str) -> None:
    async def fill() -> str:
        store = trioq.PostgresStore(pg_dsn)
        async with trioq.open_queue(_registry(), store=store, workers=1) as queue:
            job = await queue.enqueue("fail", {"n": 7})
            return (await queue.wait(job.id)).id

    dead = trio.run(fill)
    assert json.loads(run("jobs", "list", "--postgres", pg_dsn, "--state", "dead", "--json"))[0]["id"] == dead
    assert "retried 1 job(s)" in run("jobs", "retry", "--postgres", pg_dsn, "--all")
    assert json.loads(run("jobs", "show", dead, "--postgres", pg_dsn, "--json"))["state"] == "ready"
    with pytest.raises(SystemExit, match="trioq jobs list: "):
        main(["jobs", "list", "--postgres", pg_dsn, "--schema", "nothing_here"])
