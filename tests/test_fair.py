from __future__ import annotations

from collections import Counter

from trioq.stores.table.fair import FairReadyQueue


class E:
    def __init__(self, tenant: str | None, priority: int = 0) -> None:
        self.tenant, self.priority, self.slot = tenant, priority, 1


def fill(q: FairReadyQueue, tenant: str | None, n: int, seq: list[int], priority: int = 0) -> None:
    for _ in range(n):
        seq[0] += 1
        q.push(priority, (0.0, seq[0], E(tenant, priority), 1))


def test_split_by_weight() -> None:
    for weights, share in (({}, 50), ({"small": 3.0}, 75)):
        q, seq = FairReadyQueue(weights), [0]
        fill(q, "noisy", 900, seq)
        fill(q, "small", 100, seq)
        got = Counter(q.pop()[2].tenant for _ in range(100))  # type: ignore[index]
        assert abs(got["small"] - share) <= 5


def test_fifo_within_tenant_and_priority_first() -> None:
    q, seq = FairReadyQueue({}), [0]
    fill(q, "a", 3, seq)
    fill(q, "b", 1, seq, priority=5)
    assert q.first()[2].tenant == "b"  # type: ignore[index]
    assert q.pop()[2].tenant == "b"  # type: ignore[index]
    assert [q.pop()[1] for _ in range(3)] == [1, 2, 3]  # type: ignore[index]
    assert q.pop() is None and q.size == 0


def test_no_banked_credit_and_stale_dropped() -> None:
    q, seq = FairReadyQueue({}), [0]
    fill(q, "a", 10, seq)
    for _ in range(5):
        q.pop()
    fill(q, "b", 10, seq)  # b returns: starts at the current virtual time
    order = [q.pop()[2].tenant for _ in range(4)]  # type: ignore[index]
    assert Counter(order) == {"a": 2, "b": 2}
    q2, seq = FairReadyQueue({}), [0]
    fill(q2, None, 2, seq)
    q2.first()[2].slot = 2  # type: ignore[index]
    assert q2.pop()[1] == 2 and q2.size == 0  # type: ignore[index]
