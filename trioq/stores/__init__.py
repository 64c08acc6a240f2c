"""Job stores: the :class:`Store` protocol and its implementations."""

from ._base import IdMaker, NewJob, Store, StoreConfig
from .memory import MemoryStore
from .wal import WALCorruption, WALLocked, WALStore

__all__ = ["IdMaker", "MemoryStore", "NewJob", "Store", "StoreConfig", "WALCorruption", "WALLocked", "WALStore"]
