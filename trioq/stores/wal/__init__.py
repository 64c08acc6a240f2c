"""The write-ahead-log store (see ``WALStore``)."""

from ._format import WALCorruption
from .store import WALLocked, WALStore

__all__ = ["WALCorruption", "WALLocked", "WALStore"]
