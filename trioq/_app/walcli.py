"""``trioq wal verify`` and ``trioq wal inspect``: read a WAL directory without opening a queue.

Both read every log format this trioq reads (2, 3 and 4; see
``trioq.stores.wal._format``), every record type of them included (they
replay the log as an open does, read-only), and say which formats the
segments are in: a directory written by an older trioq keeps its older
segments until the first checkpoint of a newer one.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from ..stores.table.jobs import JobTable
from ..stores.wal._format import WALCorruption, list_segments, read_header
from ..stores.wal._recovery import Recovery, replay

__all__ = ["inspect_command", "verify_command"]


def _read(command: str, directory: str, err: TextIO) -> tuple[JobTable, Recovery] | int:
    """Replay ``directory`` read-only; on failure, report it and return the exit status."""
    if not os.path.isdir(directory):
        print(f"trioq wal {command}: no WAL directory at {directory}", file=err)
        return 2
    table = JobTable(max_retained=sys.maxsize)
    try:
        return table, replay(directory, table, repair=False)
    except WALCorruption as exc:
        print(f"trioq wal {command}: DAMAGED: {exc}", file=err)
        return 1


def verify_command(directory: str, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Check every segment; exit status 0 when the log replays cleanly (a torn tail is not damage).

    Exit status 1 (``DAMAGED``, on ``err``) for anything recovery would refuse
    with :class:`WALCorruption`: a damaged record, a missing segment (the
    message names the file expected), or batches missing from an older
    segment's end. 2 when ``directory`` does not exist.
    """
    read = _read("verify", directory, err)
    if isinstance(read, int):
        return read
    table, recovery = read
    torn = ""
    if recovery.truncated_bytes:
        torn = (
            f"; torn tail of {recovery.truncated_bytes} bytes after the last commit marker of "
            f"{os.path.basename(recovery.truncated_segment or '')} (an unfinished write; dropped on next open)"
        )
    print(
        f"ok: {len(recovery.segments)} segment(s){_formats(recovery)}, {recovery.records} records in "
        f"{recovery.batches} commits, {len(table)} jobs{torn}",
        file=out,
    )
    return 0


def _formats(recovery: Recovery) -> str:
    """`` (format 4)``, or ``(formats 2, 4)`` for a log of both: the formats of the segments replayed."""
    versions = sorted(set(recovery.versions.values()))
    if not versions:
        return ""
    return f" (format{'s' if len(versions) > 1 else ''} {', '.join(map(str, versions))})"


def inspect_command(directory: str, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Print job counts per state, the paused queues, the segments with their sizes, and the last checkpoint."""
    read = _read("inspect", directory, err)
    if isinstance(read, int):
        return read
    table, recovery = read
    print(f"WAL directory {directory}", file=out)
    print("jobs by state:", file=out)
    for state, n in table.counts().items():
        print(f"  {state:<10} {n:>10}", file=out)
    print(f"  {'total':<10} {len(table):>10}", file=out)
    paused = table.paused()
    print(f"paused queues: {', '.join(paused) if paused else 'none'}", file=out)
    segments = list_segments(directory)
    total = 0
    print("segments:", file=out)
    for number, path in segments:
        size = os.path.getsize(path)
        total += size
        version = recovery.versions.get(number)
        if version is None:  # not replayed: superseded by a checkpoint, or header-less
            try:
                version = read_header(path)[1]
            except WALCorruption:
                version = None
        shown = "format ?" if version is None else f"format {version}"
        print(f"  {os.path.basename(path)}  {shown}  {size:>12} bytes", file=out)
    print(f"  {'total':<34}  {total:>12} bytes", file=out)
    if recovery.last_checkpoint is None:
        print("last checkpoint: none (the log replays from its first record)", file=out)
    else:
        segment, jobs = recovery.last_checkpoint
        print(f"last checkpoint: segment {segment}, {jobs} jobs", file=out)
    print(f"records: {recovery.records} in {recovery.batches} commits", file=out)
    if recovery.truncated_bytes:
        print(f"torn tail: {recovery.truncated_bytes} bytes (dropped on next open)", file=out)
    return 0
