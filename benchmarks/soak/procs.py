"""The soak's child processes: ``trioq worker`` nodes (PostgreSQL) or one ``trioq serve`` (WAL).

:class:`Fleet` keeps ``size`` children alive: it starts them, watches them
(every exit is an ``exit`` event with its code; an exit the chaos did not ask
for is counted in ``unexpected_exits``), starts a new one in place of each that
ended, and stops them all at the end (SIGTERM, then SIGKILL past a grace).
Every signal it sends is logged before it is sent, so the verdict can match
an execution cut off by a SIGKILL to the kill.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import trio

__all__ = ["Events", "Fleet", "rss_kb"]

_ROOT = Path(__file__).resolve().parent.parent.parent
START_TIMEOUT = 60.0
BANNER = re.compile(r"(trioq serving on (http://\S+)|trioq worker (\S+):)")


class Events:
    """The harness's own log (``events.jsonl``): one JSON line per act or sighting, flushed (the verdict
    reads the file back; nothing is kept in memory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = path.open("a")

    def __call__(self, ev: str, **fields: Any) -> dict[str, Any]:
        line = {"t": time.time(), "ev": ev, **fields}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()
        return line

    def close(self) -> None:
        self._file.close()


#: Looked up here, not in the forked child (no dynamic loading between fork and exec).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the harness dies (Linux ``PR_SET_PDEATHSIG``), so a
    harness killed or crashed mid-run leaves no worker behind. The signal comes when the *thread* that
    forked exits, so children are forked from the trio thread, never from a worker thread."""
    _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def rss_kb(pid: int) -> int | None:
    """The resident set of ``pid`` in KiB, from ``/proc``; ``None`` once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


class Child:
    """One started process; its stdout and stderr go to ``logs/<pid>.log``. Made in the trio thread (see
    :func:`_die_with_parent`); :meth:`started` then waits for its banner, in a worker thread."""

    def __init__(self, command: list[str], env: dict[str, str], logs: Path, slot: int = 0) -> None:
        self.command = command
        self.slot = slot  # which of its fleet's commands made it (a replacement is made by the same)
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=_ROOT, preexec_fn=_die_with_parent
        )
        self.pid = self.process.pid
        self.log = logs / f"{self.pid}.log"
        self.signalled: str | None = None  # "kill" / "term" once the harness sent one
        self.start_s = 0.0
        self.url: str | None = None
        self._drain: IO[bytes] | None = None

    def started(self) -> None:
        """Block until the banner (``RuntimeError``, the process killed, if none in ``START_TIMEOUT`` s)."""
        from tests.processes import read_until

        started = time.monotonic()
        match, buffer = read_until(self.process, BANNER, START_TIMEOUT)
        self.start_s = time.monotonic() - started
        self.log.write_bytes(buffer)
        if match is None:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"{self.command[:3]} did not start in {START_TIMEOUT:.0f} s: {buffer[-2000:]!r}")
        self.url = match.group(2)
        self._drain = self.process.stdout

    def pump(self) -> None:
        """Move what the child wrote since the last call to its log file (never blocks)."""
        if self._drain is None:
            return
        try:
            chunk = os.read(self._drain.fileno(), 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            with self.log.open("ab") as file:
                file.write(chunk)


class Fleet:
    """One child per command of ``commands``, each replaced (by its own command's next) when it ends until
    :meth:`stop`."""

    def __init__(
        self, commands: Sequence[Callable[[], list[str]]], env: dict[str, str], logs: Path, events: Events
    ) -> None:
        self.commands = list(commands)
        self.env = env
        self.size = len(self.commands)
        self.logs = logs
        self.events = events
        self.children: list[Child] = []
        self.unexpected_exits: list[dict[str, Any]] = []
        self.term_exit_codes: list[int] = []
        self.start_seconds: list[float] = []
        self.keep_alive = True
        self.respawn_delay = 0.5

    async def spawn(self, slot: int) -> Child:
        child = Child(self.commands[slot](), self.env, self.logs, slot)
        try:
            await trio.to_thread.run_sync(child.started)
        except BaseException:
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
            raise
        self.children.append(child)
        self.start_seconds.append(child.start_s)
        self.events("spawn", pid=child.pid, start_s=round(child.start_s, 3))
        return child

    async def start(self) -> None:
        for slot in range(self.size):
            await self.spawn(slot)

    def signal(self, child: Child, how: str) -> None:
        """Send SIGKILL (``how="kill"``) or SIGTERM (``"term"``), logged first."""
        if child.process.poll() is not None:
            return
        child.signalled = child.signalled or how
        self.events(how, pid=child.pid)
        child.process.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)

    def live(self) -> list[Child]:
        return [c for c in self.children if c.process.poll() is None and c.signalled is None]

    async def watch(self) -> None:
        """Forever: log each exit, count the unexpected ones, and start a replacement while ``keep_alive``."""
        while True:
            for child in list(self.children):
                child.pump()
                code = child.process.poll()
                if code is None:
                    continue
                self.children.remove(child)
                child.pump()
                self.events("exit", pid=child.pid, code=code, signalled=child.signalled)
                if child.signalled == "term":
                    self.term_exit_codes.append(code)
                elif child.signalled is None:
                    self.unexpected_exits.append({"pid": child.pid, "code": code, "log": str(child.log)})
                if self.keep_alive:
                    await trio.sleep(self.respawn_delay)
                    await self.spawn(child.slot)
            await trio.sleep(0.1)

    async def settle(self, timeout: float) -> None:
        """Until ``size`` children run and none is on its way out (or ``timeout`` passes)."""
        with trio.move_on_after(timeout):
            # polled: a child's exit is seen by watch(), which has no event to wait on either
            while len(self.live()) < self.size or len(self.children) > self.size:  # noqa: ASYNC110
                await trio.sleep(0.1)

    async def stop(self, grace: float) -> list[int]:
        """SIGTERM every child, SIGKILL what is left after ``grace`` s; their exit codes."""
        self.keep_alive = False
        codes = []
        for child in list(self.children):
            self.signal(child, "term")
        for child in list(self.children):
            try:
                code = await trio.to_thread.run_sync(child.process.wait, grace)
            except subprocess.TimeoutExpired:
                self.signal(child, "kill")
                code = await trio.to_thread.run_sync(child.process.wait)
            child.pump()
            self.events("exit", pid=child.pid, code=code, signalled="term", final=True)
            codes.append(code)
            self.children.remove(child)
        return codes

    def kill_all(self) -> None:
        """Last resort on the way out: SIGKILL whatever still runs (never leaves a process behind)."""
        for child in self.children:
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait()
