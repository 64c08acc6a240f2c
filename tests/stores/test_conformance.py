"""The Store conformance suite, for every store trioq ships.

The cases live in the package, :mod:`trioq.stores.conformance`, so that any
store can run them; ``conftest.py`` says which kinds run here: MemoryStore,
and WALStore with each ``fsync`` mode.
"""

from __future__ import annotations

from trioq.stores.conformance import StoreConformance


class TestStoreConformance(StoreConformance):
    """Every conformance case, once per kind in ``conftest.STORE_KINDS``."""
