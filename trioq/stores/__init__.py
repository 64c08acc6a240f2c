"""Job stores: the :class:`Store` protocol, its types, and its implementations."""

from .._exports import show_as_public
from ._base import (
    CancelResult,
    ClaimRequest,
    Failed,
    IdMaker,
    JobFilter,
    NewJob,
    Outcome,
    Released,
    Snoozed,
    Store,
    StoreConfig,
    Succeeded,
)
from .memory import MemoryStore
from .postgres import PostgresStore
from .wal import WALCorruption, WALLocked, WALStore

__all__ = [
    "CancelResult",
    "ClaimRequest",
    "Failed",
    "IdMaker",
    "JobFilter",
    "MemoryStore",
    "NewJob",
    "Outcome",
    "PostgresStore",
    "Released",
    "Snoozed",
    "Store",
    "StoreConfig",
    "Succeeded",
    "WALCorruption",
    "WALLocked",
    "WALStore",
]

show_as_public(__name__, globals())
del show_as_public
