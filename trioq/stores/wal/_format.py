"""The on-disk format of the write-ahead log: segments, records, commit markers.

A log is a directory of segment files named ``NNNNNNNNNNNNNNNNNNNN.wal`` (the
segment number, zero-padded). Each segment opens with a header::

    magic b"TRIOQWAL" | format version u16 | segment number u64 | CRC32C of those u32

and then holds records, each framed as::

    payload length u32 | CRC32C of (type + payload) u32 | type u8 | payload

A record's payload is the msgpack array of its typed struct's fields
(:mod:`._records` lists every type and its fields). Every group commit ends
with a COMMIT record (type 255) whose payload is::

    b"TQCOMMIT" | batch number u64 | batch start offset u64 | CRC32C u32 per page chunk

Recovery applies a batch only once it has read that batch's commit marker. The
page chunks are the batch's bytes (start offset to marker) cut at every 4 KiB
file boundary; the writer records their CRCs when it overwrites zero-filled
blocks (``fsync="always"``), and none otherwise. They let recovery tell a page of
the last batch that a power cut left unwritten (zeros where the CRC says
otherwise) from damage (any other mismatch). All integers are little-endian.

Format versions: this trioq writes format 6 (:data:`VERSION`) and reads 2 to
6 (:data:`READABLE_VERSIONS`); the version is per segment. All five
frame and commit alike. The rule: the number moves whenever a trioq of the
previous format would misread the new segments, rather than refuse them.

- Format 3 records may carry fields format 2 ones lack (a FAIL's traceback,
  a nil ``retry_at``, an ENTRY's errors and snoozes) and SNOOZE records.
- Format 4 writes ADD's and ENTRY's trailing ``queue``, ``tenant``,
  ``limits`` and ``deadline`` (declared in format 3, never written: a
  format-3 trioq would decode them and drop them, putting every job in the
  default queue with no deadline and no limit), a CLAIM's time (for a job
  holding limit keys) and a checkpoint's paused queues and rate tokens (on
  CHECKPOINT_BEGIN), which it would ignore, and three new record types,
  EXPIRE, PAUSE and RESUME (13 to 15, which it would call damage). See
  :mod:`._records`.
- Format 5 writes ADD's trailing ``deferred`` flag (a job enqueued past the
  admission bound) and ADMIT records (16), both damage to a format-4 reader.
- Format 6 writes ADD's and ENTRY's trailing ``after`` (a job's parents,
  declared since format 3, never written: a format-5 trioq would drop them
  and run children before their parents) and ENTRY's ``cancelled_by``.

A directory written by a trioq of an older format opens as it is (upgrade in
place): its segments are read as their format, the new session writes
format-6 segments after them, and the first checkpoint deletes the old ones.
A segment of an older format after one of a newer is corruption (only a trioq
of the older format could have written it, and that trioq cannot open the
directory once it holds a segment of the newer one).
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterator
from typing import Any

import attrs
import msgspec
from crc32c import crc32c

from ..._model import TrioqError
from ..table.store import (
    ADD,
    ADMIT,
    CANCEL,
    CLAIM,
    DROP,
    EXPIRE,
    FAIL,
    PAUSE,
    RELEASE,
    RESUME,
    RETRY,
    SNOOZE,
    SUCCEED,
)
from ._records import CHECKPOINT_BEGIN, CHECKPOINT_END, ENTRY, RECORDS, Record, record_fields

__all__ = [
    "ADD",
    "ADMIT",
    "CANCEL",
    "CHECKPOINT_BEGIN",
    "CHECKPOINT_END",
    "CLAIM",
    "COMMIT",
    "DROP",
    "ENTRY",
    "EXPIRE",
    "FAIL",
    "HEADER_SIZE",
    "PAUSE",
    "READABLE_VERSIONS",
    "RELEASE",
    "RESUME",
    "RETRY",
    "SNOOZE",
    "SUCCEED",
    "VERSION",
    "Scan",
    "WALCorruption",
    "chunk_crcs",
    "commit_frame",
    "commit_info",
    "frame",
    "frame_record",
    "header",
    "read_header",
    "scan_segment",
    "segment_name",
    "segment_number",
]

MAGIC = b"TRIOQWAL"
#: The format version of the segments this trioq writes.
VERSION = 6
#: The format versions it reads (see the module docstring).
READABLE_VERSIONS = (2, 3, 4, 5, 6)
_HEADER = struct.Struct("<8sHQ")
_HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size
_FRAME = struct.Struct("<IIB")
FRAME_OVERHEAD = _FRAME.size
COMMIT_MAGIC = b"TQCOMMIT"
_COMMIT_BODY = struct.Struct("<8sQQ")  # magic, batch, start; then the page chunk CRCs
_CHUNK_CRC = struct.Struct("<I")
#: The unit a disk writes atomically, at worst (a torn write loses whole pages).
PAGE = 4096
#: A payload longer than this is damage, not data (a torn length field).
MAX_PAYLOAD = 1 << 30

# Record types: the table's transitions (from trioq/stores/table/store.py) and
# the checkpoint's records (see _records), then the commit marker.
COMMIT = 255
KNOWN_TYPES = frozenset(RECORDS)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
#: The CRC32C of each type byte: a frame's CRC covers its type byte, then its payload, so the
#: payload's CRC continues from this without joining the two first.
_TYPE_CRCS = tuple(crc32c(bytes((kind,))) for kind in range(256))


class WALCorruption(TrioqError):
    """The log is damaged somewhere other than an unfinished last write.

    ``path`` and ``offset`` say where. Nothing past the damage was replayed.
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


def segment_name(number: int) -> str:
    return f"{number:020d}.wal"


def segment_number(name: str) -> int | None:
    """The number of a segment file name, or ``None`` for any other file."""
    stem, dot, ext = name.partition(".")
    if ext != "wal" or not dot or len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


def header(number: int) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, number)
    return head + _HEADER_CRC.pack(crc32c(head))


def frame(kind: int, fields: Any) -> bytes:
    """One record: frame header, then ``fields`` as msgpack.

    ``fields`` is the tuple of the fields of the struct of type ``kind`` (see
    :mod:`._records`), in order, trailing defaults left off or not: the hot
    path, which builds no struct (``TableStore._record`` hands tuples).
    """
    payload = _encoder.encode(fields)
    return _FRAME.pack(len(payload), crc32c(payload, _TYPE_CRCS[kind]), kind) + payload


def frame_record(record: Record) -> bytes:
    """One record from its struct (trailing fields at their defaults left off, as every writer does)."""
    return frame(record.kind, record_fields(record))


def commit_frame(batch: int, start: int = 0, chunk_crcs: tuple[int, ...] = ()) -> bytes:
    """The commit marker of a batch that began at file offset ``start`` (see :func:`chunk_crcs`)."""
    crcs = b"".join(_CHUNK_CRC.pack(c) for c in chunk_crcs)
    payload = _COMMIT_BODY.pack(COMMIT_MAGIC, batch, start) + crcs
    return _FRAME.pack(len(payload), crc32c(payload, _TYPE_CRCS[COMMIT]), COMMIT) + payload


def commit_info(payload: bytes | memoryview) -> tuple[int, int, bool]:
    """A commit marker's batch number, the file offset its batch began at (0 in
    checkpoints of older logs), and whether it carries page chunk CRCs (only
    ``fsync="always"`` writes them), from the marker's payload."""
    _, batch, start = _COMMIT_BODY.unpack_from(payload)
    return int(batch), int(start), len(payload) > _COMMIT_BODY.size


def _chunks(start: int, end: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut at every :data:`PAGE` boundary of the file."""
    cuts = [start, *range((start // PAGE + 1) * PAGE, end, PAGE), end]
    return list(itertools.pairwise(cuts))


def chunk_crcs(data: bytes, start: int) -> tuple[int, ...]:
    """The CRC32C of each page chunk of ``data`` written at file offset ``start``."""
    view = memoryview(data)
    return tuple(crc32c(view[lo - start : hi - start]) for lo, hi in _chunks(start, start + len(data)))


def _commit_length_ok(length: int) -> bool:
    return length >= _COMMIT_BODY.size and (length - _COMMIT_BODY.size) % _CHUNK_CRC.size == 0


def decode(payload: bytes | memoryview) -> Any:
    """A record's payload as plain msgpack (lists): for looking at a log; replay decodes records typed."""
    return _decoder.decode(payload)


@attrs.define
class Scan:
    """What reading one segment found.

    ``data`` is the segment's bytes. Every record between the header and
    ``committed_end`` (the offset just past the last commit marker) is
    checksummed and committed: :meth:`committed` yields them. ``batches`` counts
    the commit markers, ``records`` the other records before ``committed_end``,
    ``first_kind`` is the type of the first record (``None`` if none);
    ``version`` the segment's format version.
    ``damage_at`` is the offset of the first unreadable byte, if any; ``damage``
    says what was wrong there. ``commit_after_damage`` is True when a valid
    commit marker lies beyond the damage, which makes it corruption rather
    than a torn tail.
    """

    path: str
    number: int
    size: int
    data: bytes = attrs.field(repr=False)
    committed_end: int
    batches: int = 0
    records: int = 0
    first_kind: int | None = None
    damage_at: int | None = None
    damage: str | None = None
    commit_after_damage: bool = False
    version: int = VERSION

    def torn_final_batch(self) -> bool:
        """Whether the damage is pages of the last group commit that never reached the disk.

        With ``fsync="always"`` a group commit overwrites zero-filled blocks, and
        a power cut during its fdatasync can leave some of its pages unwritten
        (zeros) while a later page, holding its commit marker, did reach the
        disk. Such a batch was never acknowledged: it is a torn write, not
        corruption. True only when the damage lies in the final batch (exactly
        one valid commit marker after it, starting where the last good batch
        ended, then nothing but zeros) and every page chunk of that batch whose
        CRC the marker contradicts is all zeros. Any other mismatch (a flipped
        byte, even beside a page of zeros a record legitimately holds) is damage.
        """
        if self.damage_at is None:
            return False
        data = self.data
        markers = list(_commits_after(data, self.damage_at + 1))
        if len(markers) != 1:
            return False
        begin, end = markers[0]
        if data.count(0, end) != len(data) - end:
            return False
        _, _, start = _COMMIT_BODY.unpack_from(data, begin + FRAME_OVERHEAD)
        crcs = [c for (c,) in _CHUNK_CRC.iter_unpack(data[begin + FRAME_OVERHEAD + _COMMIT_BODY.size : end])]
        chunks = _chunks(start, begin)
        if start != self.committed_end or len(crcs) != len(chunks):
            return False
        torn = False
        for (lo, hi), crc in zip(chunks, crcs, strict=True):
            if crc32c(data[lo:hi]) != crc:
                if data.count(0, lo, hi) != hi - lo:
                    return False
                torn = True
        return torn

    def committed(self) -> Iterator[tuple[int, memoryview, int]]:
        """``(type, payload, offset)`` of each committed record, commit markers included.

        Reads frames again without checking them: :func:`scan_segment` did.
        Streaming them keeps replay's memory to the table plus one segment.
        """
        data, view, unpack = self.data, memoryview(self.data), _FRAME.unpack_from
        pos, end = HEADER_SIZE, self.committed_end
        while pos < end:
            length, _, kind = unpack(data, pos)
            stop = pos + FRAME_OVERHEAD + length
            yield kind, view[pos + FRAME_OVERHEAD : stop], pos
            pos = stop


def _read_header(data: bytes, path: str) -> tuple[int, int]:
    """The segment number and format version of a segment's header; :class:`WALCorruption` if unreadable."""
    if len(data) < HEADER_SIZE:
        raise WALCorruption(f"{path}: segment header is truncated ({len(data)} bytes)", path=path, offset=0)
    magic, version, number = _HEADER.unpack_from(data, 0)
    (crc,) = _HEADER_CRC.unpack_from(data, _HEADER.size)
    if magic != MAGIC or crc != crc32c(data[: _HEADER.size]):
        raise WALCorruption(f"{path}: not a trioq WAL segment (bad header)", path=path, offset=0)
    if version not in READABLE_VERSIONS:
        *older, newest = map(str, READABLE_VERSIONS)
        readable = f"{', '.join(older)} and {newest}" if older else newest
        raise WALCorruption(
            f"{path}: WAL format version {version}; this trioq reads versions {readable}", path=path, offset=0
        )
    return int(number), int(version)


def read_header(path: str) -> tuple[int, int]:
    """The segment number and format version a segment file's header gives (it reads the header alone)."""
    with open(path, "rb") as f:
        return _read_header(f.read(HEADER_SIZE), path)


def scan_segment(path: str) -> Scan:
    """Read a segment and check every record, locating the committed end and any damage."""
    with open(path, "rb") as f:
        data = f.read()
    number, version = _read_header(data, path)
    view = memoryview(data)
    size = len(data)
    batches = records = pending = 0
    first_kind: int | None = None
    pos = committed_end = HEADER_SIZE
    unpack = _FRAME.unpack_from
    damage: str | None = None
    while pos < size:
        if size - pos < FRAME_OVERHEAD:
            damage = "truncated record header"
            break
        length, crc, kind = unpack(data, pos)
        end = pos + FRAME_OVERHEAD + length
        if length > MAX_PAYLOAD or end > size:
            damage = "truncated record"
            break
        if crc32c(view[pos + 8 : end]) != crc:
            damage = "checksum mismatch"
            break
        if first_kind is None:
            first_kind = kind
        if kind == COMMIT:
            if not _commit_length_ok(length) or data[pos + FRAME_OVERHEAD : pos + FRAME_OVERHEAD + 8] != COMMIT_MAGIC:
                damage = "malformed commit marker"
                break
            batches += 1
            records += pending
            pending = 0
            committed_end = end
        elif kind in KNOWN_TYPES:
            pending += 1
        else:
            damage = f"unknown record type {kind}"
            break
        pos = end
    del view
    scan = Scan(path, number, size, data, committed_end, batches, records, first_kind, version=version)
    if damage is not None:
        scan.damage_at = pos
        scan.damage = damage
        scan.commit_after_damage = _valid_commit_after(data, pos + 1)
    return scan


def _commits_after(data: bytes, start: int) -> Iterator[tuple[int, int]]:
    """``(begin, end)`` offsets of every well-formed, checksummed commit marker beginning after ``start``."""
    at = data.find(COMMIT_MAGIC, start)
    while at != -1:
        begin = at - FRAME_OVERHEAD
        if begin >= start - 1 and begin >= HEADER_SIZE:
            length, crc, kind = _FRAME.unpack_from(data, begin)
            end = begin + FRAME_OVERHEAD + length
            if (
                kind == COMMIT
                and _commit_length_ok(length)
                and end <= len(data)
                and crc == crc32c(data[begin + 8 : end])
            ):
                yield begin, end
        at = data.find(COMMIT_MAGIC, at + 1)


def _valid_commit_after(data: bytes, start: int) -> bool:
    """Whether a well-formed, checksummed commit marker begins anywhere after ``start``."""
    return next(_commits_after(data, start), None) is not None


def list_segments(directory: str) -> list[tuple[int, str]]:
    """``(number, path)`` of every segment in ``directory``, oldest first."""
    found = []
    for name in os.listdir(directory):
        number = segment_number(name)
        if number is not None:
            found.append((number, os.path.join(directory, name)))
    found.sort()
    return found
