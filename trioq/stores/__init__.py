"""Job stores: the :class:`Store` protocol and its implementations."""

from .._exports import show_as_public
from ._base import IdMaker, NewJob, Store, StoreConfig
from .memory import MemoryStore
from .wal import WALCorruption, WALLocked, WALStore

__all__ = ["IdMaker", "MemoryStore", "NewJob", "Store", "StoreConfig", "WALCorruption", "WALLocked", "WALStore"]

show_as_public(__name__, globals())
del show_as_public
