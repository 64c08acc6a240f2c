"""The store kinds the conformance suite (``test_conformance.py``) runs for.

Every case of :class:`trioq.stores.conformance.StoreConformance` runs once per
kind in :data:`STORE_KINDS`, through the parametrized ``store_kind`` fixture.
To add a store, add one entry (see :class:`~trioq.stores.conformance.StoreKind`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import trioq
from trioq.stores import Store, WALStore
from trioq.stores.conformance import StoreKind


async def _checkpoint(store: Store) -> None:
    assert isinstance(store, WALStore)
    await store.checkpoint()


STORE_KINDS: dict[str, StoreKind] = {
    # A MemoryStore keeps its jobs in the object, so reopening is reusing it.
    "memory": StoreKind(make=lambda path: trioq.MemoryStore(), reopen=lambda store, path: store),
    # A WALStore keeps its jobs in its directory: reopening is a new store over
    # the same directory (the default), so every reopen replays the log.
    "wal-never": StoreKind(make=lambda path: trioq.WALStore(path / "wal", fsync="never"), checkpoint=_checkpoint),
    # The fsync policies share every code path of the log but when it flushes: the model-based
    # run takes its full 100 examples on "never" and half on the other two, for the suite's time.
    "wal-always": StoreKind(
        make=lambda path: trioq.WALStore(path / "wal", fsync="always"), checkpoint=_checkpoint, model_examples=50
    ),
    "wal-interval": StoreKind(
        make=lambda path: trioq.WALStore(path / "wal", fsync="interval"), checkpoint=_checkpoint, model_examples=50
    ),
}


def schema_for(path: Path) -> str:
    """A schema of its own for the store of a case (or of a model-based example) kept under ``path``."""
    return "t_" + hashlib.sha1(str(path).encode()).hexdigest()[:24]


def postgres_kind(dsn: str, *, nodes: int = 2, model_examples: int | None = 15) -> StoreKind:
    """PostgresStore on the test cluster: a schema per case, its sessions on the same schema as nodes.
    Its model-based run takes 15 examples (the embedded stores take 50 to 100): every call is a round
    trip, each example opens a fresh schema and several sessions (most of its time), and the three-node
    run (tests/stores/test_conformance.py) adds 18 more."""
    return StoreKind(
        make=lambda path: trioq.PostgresStore(dsn, schema=schema_for(path)),
        reopen=lambda store, path: trioq.PostgresStore(dsn, schema=schema_for(path)),
        concurrent_sessions=True,
        inline_hints=False,
        nodes=nodes,
        bound_at_evict=True,
        model_examples=model_examples,
    )


@pytest.fixture(params=[*sorted(STORE_KINDS), "postgres"])
def store_kind(request: pytest.FixtureRequest) -> StoreKind:
    """Each kind of store in turn (PostgresStore on the session's throwaway cluster)."""
    if request.param == "postgres":
        return postgres_kind(request.getfixturevalue("pg_cluster").dsn)
    kind: StoreKind = STORE_KINDS[request.param]
    return kind
