"""The Store conformance suite: the cases every :class:`~trioq.stores.Store` must pass.

Like River's ``riverdrivertest``, the suite ships with the package, so a store
written outside trioq runs the very cases trioq's own stores run. It drives
a store only through the protocol of :mod:`trioq.stores`, on a fake wall
clock, recording the hints the store gives. It needs pytest and pytest-trio
(and hypothesis for the model-based case), which trioq itself never imports.

To run it for a store, subclass :class:`StoreConformance` in a test module
and provide a ``store_kind`` fixture (as a method of the class, or from a
``conftest.py``, where it may be parametrized over several kinds)::

    import pytest
    from trioq.stores.conformance import StoreConformance, StoreKind

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def store_kind(self) -> StoreKind:
            return StoreKind(make=lambda path: MyStore(path / "data"))

:class:`StoreKind` says how to build the store and what it promises
(reopening, a checkpoint, concurrent sessions, inline hints); a case that
needs a promise the kind does not make is skipped, saying why. Every case is
a method of the class: pytest collects them in the subclass, and ``-k``
selects among them as usual (``-k model`` for the model-based run alone).

Two kinds of cases:

- Named cases, each showing one rule of the protocol (its docstring says
  which), ported from trioq's first conformance suite and extended for the
  second version of the protocol (batched claims, ``extend``, ``complete``
  with every outcome, ``Job.errors``, snoozes, hints, ``rescue``, nodes).
- ``test_model_based_run``: a hypothesis state machine calls the store at
  random (adds, claims, outcomes of every kind and stale ones, extends,
  cancels, retries, the clock moving, evictions, views, session reopens)
  and checks after every step that it agrees with a reference model written
  in plain Python from the protocol's documentation (``_reference.py``).
  ``StoreConformance.model_examples`` and ``model_steps`` bound the run.
"""

from __future__ import annotations

from ..._exports import show_as_public
from ._cases_admin import CancelCases, EvictCases, PromoteCases, RescueCases, RetryCases, ViewCases
from ._cases_cron import CronCases
from ._cases_defer import DeferCases
from ._cases_fair import FairnessCases
from ._cases_flows import FlowCases
from ._cases_jobs import AddCases, ClaimCases, CompleteCases, ExtendCases
from ._cases_limits import LimitCases
from ._cases_model import ModelCases
from ._cases_policies import LimitInvariantCases, LimitKeyCases
from ._cases_queues import DeadlineCases, QueueCases
from ._cases_sessions import DurabilityCases, SessionCases
from ._harness import FakeClock, Harness, Hints, StoreKind

__all__ = ["FakeClock", "Harness", "Hints", "StoreConformance", "StoreKind"]


class StoreConformance(
    # pytest collects inherited cases base class first (reverse MRO): this
    # order runs them from add to the model-based run.
    ModelCases,
    CronCases,
    FlowCases,
    FairnessCases,
    DeferCases,
    LimitInvariantCases,
    LimitKeyCases,
    DeadlineCases,
    QueueCases,
    LimitCases,
    DurabilityCases,
    SessionCases,
    RescueCases,
    ViewCases,
    EvictCases,
    PromoteCases,
    RetryCases,
    CancelCases,
    CompleteCases,
    ExtendCases,
    ClaimCases,
    AddCases,
):
    """Every conformance case, for the store of the ``store_kind`` fixture.

    Subclass it under a name pytest collects (``Test...``) and provide
    ``store_kind`` (a :class:`StoreKind`); the cases ask for it through the
    ``harness`` fixture (a :class:`Harness` over a fresh ``tmp_path``) and
    the ``store`` fixture (a store of that kind, open in a session). Cases
    that need what the kind does not promise (a checkpoint, concurrent
    sessions, inline hints) skip, saying so.

    The model-based case runs :attr:`model_examples` examples of up to
    :attr:`model_steps` steps; a subclass may change either.
    """


# Only the exported names: the case classes keep their own modules.
show_as_public(__name__, {name: globals()[name] for name in __all__})
del show_as_public
