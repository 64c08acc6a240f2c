"""The Store conformance suite, for every store trioq ships.

The cases live in the package, :mod:`trioq.stores.conformance`, so that any
store can run them; ``conftest.py`` says which kinds run here: MemoryStore,
WALStore with each ``fsync`` mode, and PostgresStore (two nodes; three in the model-based run below).
"""

from __future__ import annotations

import pytest

from tests.pgcluster import Cluster, ExternalCluster
from tests.stores.conftest import postgres_kind
from trioq.stores.conformance import StoreConformance, StoreKind
from trioq.stores.conformance._cases_model import ModelCases


class TestStoreConformance(StoreConformance):
    """Every conformance case, once per kind in ``conftest.STORE_KINDS``.

    For the suite's time: the random limit run takes 25 examples here, not the case's 60, and the
    model-based run 60, not 100 (kinds that set their own take theirs).
    """

    limit_examples = 25
    model_examples = 60


class TestModelBasedRunOnThreePostgresNodes(ModelCases):
    """The model-based run again for PostgresStore, through three nodes on one schema."""

    @pytest.fixture
    def store_kind(self, pg_cluster: Cluster | ExternalCluster) -> StoreKind:
        return postgres_kind(pg_cluster.dsn, nodes=3, model_examples=18)
