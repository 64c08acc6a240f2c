"""trioq: a job runtime for trio applications.

Enqueue work, run it on a bounded pool of workers inside your own nursery,
retry it with backoff, detect hung work, and (with a durable store) survive
``kill -9``. Everything public is re-exported here; the modules behind it are
private.
"""

from ._context import JobContext
from ._exports import show_as_public
from ._model import (
    Adaptive,
    Backoff,
    FailedAttempt,
    InvalidJob,
    Job,
    JobNotFound,
    JobSpec,
    JobState,
    Limit,
    NoRetry,
    Overloaded,
    QueueFull,
    Snooze,
    TrioqError,
    UnknownTask,
)
from ._registry import Registry
from ._runtime.queue import Queue, WaitTimeout, open_queue
from ._runtime.runners import ProcessJobContext
from .stores import MemoryStore, PostgresStore, Store, WALCorruption, WALLocked, WALStore

__version__ = "0.1.0"

__all__ = [
    "Adaptive",
    "Backoff",
    "FailedAttempt",
    "InvalidJob",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobSpec",
    "JobState",
    "Limit",
    "MemoryStore",
    "NoRetry",
    "Overloaded",
    "PostgresStore",
    "ProcessJobContext",
    "Queue",
    "QueueFull",
    "Registry",
    "Snooze",
    "Store",
    "TrioqError",
    "UnknownTask",
    "WALCorruption",
    "WALLocked",
    "WALStore",
    "WaitTimeout",
    "open_queue",
]

show_as_public(__name__, globals())
del show_as_public
