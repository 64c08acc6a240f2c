"""Cases for tenant fairness (``StoreConfig.fairness``): start-time fair queueing among tenants."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from .._base import Store
from ._fixtures import CaseBase
from ._harness import Harness

__all__ = ["FairnessCases"]


async def _claim_tenants(store: Store, harness: Harness, claims: int, limit: int = 1) -> list[str | None]:
    """The tenants of the jobs ``claims`` claims of ``limit`` each take, in order."""
    tenants: list[str | None] = []
    for _ in range(claims):
        tenants += [job.tenant for job in await store.claim(harness.request(limit))]
    return tenants


class FairnessCases(CaseBase):
    """With ``fairness`` on, the next claim goes to the tenant furthest behind its weighted share, among
    claimable jobs of the best priority; FIFO within a tenant; a tenant that idled banks no credit."""

    async def _fill(self, store: Store, harness: Harness, counts: Mapping[str | None, int]) -> None:
        for tenant, n in counts.items():
            await store.add([harness.job(tenant=tenant, payload={"i": i}) for i in range(n)])

    async def test_a_noisy_tenant_does_not_crowd_out_a_small_one(self, harness: Harness) -> None:
        """900 jobs of one tenant enqueued before 100 of another: claimed one at a time, the small tenant
        gets its weighted share (within 5 of 100 claims) from the first claim on: half at equal weights,
        three quarters at weight 3."""
        for weights, share in (({}, 50), ({"small": 3.0}, 75)):
            async with harness.session(harness.make(), fairness=weights) as store:
                await self._fill(store, harness, {"noisy": 900, "small": 100})
                got = Counter(await _claim_tenants(store, harness, 100))
                assert abs(got["small"] - share) <= 5, (weights, got)
                assert got["small"] + got["noisy"] == 100
            harness.path = harness.path / "next"  # a fresh store for the next weights
            harness.path.mkdir()

    async def test_a_batch_is_shared_by_weight(self, harness: Harness) -> None:
        """A tenant may get several jobs of one claim: a batch of 8 at weights 3:1 is 6 and 2, and one of 20
        with four tenants at equal weights gives each 5."""
        async with harness.session(harness.make(), fairness={"a": 3.0}) as fair:
            await self._fill(fair, harness, {"a": 20, "b": 20})
            assert Counter(await _claim_tenants(fair, harness, 1, limit=8)) == {"a": 6, "b": 2}
        harness.path = harness.path / "next"
        harness.path.mkdir()
        async with harness.session(harness.make(), fairness={}) as fair:
            await self._fill(fair, harness, {"w": 10, "x": 10, "y": 10, "z": 10})
            assert Counter(await _claim_tenants(fair, harness, 1, limit=20)) == {"w": 5, "x": 5, "y": 5, "z": 5}

    async def test_an_idle_tenant_banks_no_credit(self, harness: Harness) -> None:
        """A tenant that had nothing ready while another ran alone starts at the virtual time when it comes
        back: it shares from then on, it does not get the claims it missed."""
        async with harness.session(harness.make(), fairness={}) as store:
            await self._fill(store, harness, {"a": 10})
            assert await _claim_tenants(store, harness, 5) == ["a"] * 5
            await self._fill(store, harness, {"b": 10})
            assert Counter(await _claim_tenants(store, harness, 4)) == {"a": 2, "b": 2}

    async def test_fifo_within_a_tenant(self, harness: Harness) -> None:
        """Each tenant's jobs are claimed in enqueue order, interleaved with the other tenants'."""
        async with harness.session(harness.make(), fairness={}) as store:
            jobs = await store.add([harness.job(tenant=t, payload={"i": i}) for i in range(4) for t in ("a", "b")])
            claimed = [job for _ in range(8) for job in await store.claim(harness.request(1))]
            for tenant in ("a", "b"):
                mine = [job.id for job in claimed if job.tenant == tenant]
                assert mine == [job.id for job in jobs if job.tenant == tenant]

    async def test_priority_comes_before_fairness(self, harness: Harness) -> None:
        """A job of a better priority is claimed first, whichever tenant is behind its share; fairness
        orders tenants among the jobs of the best priority only."""
        async with harness.session(harness.make(), fairness={"a": 10.0}) as store:
            await self._fill(store, harness, {"a": 5})
            assert await _claim_tenants(store, harness, 2) == ["a", "a"]
            (urgent,) = await store.add([harness.job(tenant="b", priority=5)])
            await store.add([harness.job(tenant="b")])
            first = await store.claim(harness.request(1))
            assert [job.id for job in first] == [urgent.id]
            # Among priority 0, the weight of a (10) wins most claims; b still gets its turn.
            got = Counter(await _claim_tenants(store, harness, 4))
            assert got["a"] >= 3 and got["a"] + got["b"] == 4

    async def test_jobs_without_a_tenant_are_one_more_tenant(self, harness: Harness) -> None:
        """Jobs with no tenant share as one tenant of weight 1.0 (as an unlisted tenant does)."""
        async with harness.session(harness.make(), fairness={"a": 1.0}) as store:
            await self._fill(store, harness, {None: 30, "a": 10})
            got = Counter(await _claim_tenants(store, harness, 10))
            assert got == {None: 5, "a": 5}

    async def test_each_named_queue_is_its_own_fair_queue(self, harness: Harness) -> None:
        """Claims of one queue charge that queue's tenants only: a tenant busy in one queue is not behind
        in another."""
        async with harness.session(harness.make(), fairness={}) as store:
            await store.add([harness.job(queue="q1", tenant="a") for _ in range(6)])
            await store.add([harness.job(queue="q2", tenant="a") for _ in range(3)])
            await store.add([harness.job(queue="q2", tenant="b") for _ in range(3)])
            for _ in range(6):
                assert [job.tenant for job in await store.claim(harness.request(1, queues=["q1"]))] == ["a"]
            got = [job.tenant for _ in range(4) for job in await store.claim(harness.request(1, queues=["q2"]))]
            assert Counter(got) == {"a": 2, "b": 2}

    async def test_claims_of_every_queue_take_the_queue_whose_fair_pick_comes_first(self, harness: Harness) -> None:
        """Fairness orders tenants within a queue; among queues a claim takes the queue whose fairly chosen
        job comes first in claim order (priority, ``run_at``, enqueue order), as without fairness. The tags
        of different queues are not compared."""
        async with harness.session(harness.make(), fairness={}) as store:
            first = await store.add([harness.job(queue="q1", tenant="a") for _ in range(3)])
            second = await store.add([harness.job(queue="q2", tenant=tenant) for tenant in ("b", "c", "b", "c")])
            one_by_one = [job.id for _ in range(7) for job in await store.claim(harness.request(1))]
            assert one_by_one == [job.id for job in first + second]
        harness.path = harness.path / "next"
        harness.path.mkdir()
        async with harness.session(harness.make(), fairness={}) as store:
            first = await store.add([harness.job(queue="q1", tenant="a") for _ in range(3)])
            second = await store.add([harness.job(queue="q2", tenant=tenant) for tenant in ("b", "c", "b", "c")])
            batch = await store.claim(harness.request(7))
            assert [job.id for job in batch] == [job.id for job in first + second]
