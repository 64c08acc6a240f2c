"""Cases for what a store can hold: names, payloads, results, error texts, odd types.

Each once broke a store: a value reached the WAL's encoder after the table
had changed, and the next open failed to replay the log.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..._model import (
    MAX_DEPTH,
    MAX_ERROR_CHARS,
    MAX_NAME_BYTES,
    MAX_VALUE_BYTES,
    InvalidJob,
    JobNotFound,
    JobState,
    storable_text,
)
from .._base import Failed, NewJob, Store, Succeeded
from ._fixtures import CaseBase, zero_counts
from ._harness import Harness, claim_one, complete_one

__all__ = ["LimitCases"]

_UNSTORABLE_NAMES = {
    "surrogate": "k\udcff",
    "nul": "k\x00",
    "too-long": "k" * (MAX_NAME_BYTES + 1),
    "too-long-utf8": "é" * (MAX_NAME_BYTES // 2 + 1),
}


class _Str(str):
    """A str subclass (numpy.str_ is one): the log's encoder takes none."""

    __slots__ = ()


class _Int(int):
    """An int subclass."""

    __slots__ = ()


class _Float(float):
    """A float subclass."""

    __slots__ = ()


def _deep(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = [value]
    return value


class _Lying(dict[str, object]):
    """Says it is empty."""

    def __len__(self) -> int:
        return 0

    def __bool__(self) -> bool:
        return False


class _Hiding(dict[object, object]):
    """Shows a checker different items from what it holds."""

    def items(self) -> Any:
        return [("a", 1)]


def _named(harness: Harness, field: str, name: str) -> NewJob:
    """A job whose ``field`` (``"task"`` or ``"key"``) is ``name``."""
    return harness.job(task=name) if field == "task" else harness.job(key=name)


class LimitCases(CaseBase):
    """What a store refuses (changing nothing), and what it keeps made storable."""

    @pytest.mark.parametrize("field", ["task", "key"])
    @pytest.mark.parametrize("bad", sorted(_UNSTORABLE_NAMES))
    async def test_a_name_the_store_cannot_hold_is_refused_and_changes_nothing(
        self, harness: Harness, field: str, bad: str
    ) -> None:
        """A task or key no store can hold raises ``InvalidJob`` naming the field, alone or in a batch."""
        value = _UNSTORABLE_NAMES[bad]
        first_store = harness.make()
        async with harness.session(first_store) as store:
            with pytest.raises(InvalidJob, match="cannot be stored") as excinfo:
                await store.add([_named(harness, field, value)])
            assert excinfo.value.field == field
            with pytest.raises(InvalidJob, match="cannot be stored") as excinfo:
                await store.add([harness.job(), _named(harness, field, value)])
            assert excinfo.value.field == f"jobs[1].{field}"
            assert await store.counts() == zero_counts()
            assert await store.claim(harness.request()) == []
            fine = harness.job(key="k\u00e9" * (MAX_NAME_BYTES // 3))  # non-ASCII, within the limit
            (kept,) = await store.add([fine])
        async with harness.session(harness.reopen(first_store)) as store:
            assert await store.counts() == zero_counts(ready=1)
            assert (await store.get(kept.id)).key == fine.key

    async def test_the_longest_names_are_held_and_keys_of_that_length_still_deduplicate(
        self, store: Store, harness: Harness
    ) -> None:
        """A task name and a key of ``MAX_NAME_BYTES`` (multi-byte characters too) are kept, and the key
        still returns its job (a database index limits its entries to fewer bytes: PostgreSQL's to 2704)."""
        for char in ("k", "é"):
            name = char * (MAX_NAME_BYTES // len(char.encode()))
            (job,) = await store.add([harness.job(name, key=name)])
            (again,) = await store.add([harness.job(name, key=name, priority=7)])
            assert again.id == job.id
            assert (await store.get(job.id)).task == name
            assert (await store.get(job.id)).key == name

    async def test_a_payload_over_the_size_limit_is_refused_and_changes_nothing(
        self, store: Store, harness: Harness
    ) -> None:
        """A payload over 256 MiB raises ``InvalidJob`` naming it, and adds nothing."""
        over = {"blob": "x" * MAX_VALUE_BYTES}  # its msgpack framing takes it over
        with pytest.raises(InvalidJob, match="256 MiB") as excinfo:
            await store.add([harness.job(payload=over)])
        assert excinfo.value.field == "payload"
        with pytest.raises(InvalidJob, match="256 MiB") as excinfo:
            await store.add([harness.job(), harness.job(payload=over)])
        assert excinfo.value.field == "jobs[1].payload"
        assert await store.counts() == zero_counts()

    async def test_a_result_over_the_size_limit_kills_the_job(self, store: Store, harness: Harness) -> None:
        """A result over 256 MiB kills its job (an ``InvalidJob`` error saying so); one that fits succeeds."""
        over, in_a_list, fits = await store.add([harness.job(), harness.job(), harness.job()])
        half = "x" * (MAX_VALUE_BYTES // 2)
        for job, result in ((over, half + half + "x"), (in_a_list, [half, half])):
            claimed = await claim_one(store)
            assert claimed.id == job.id
            assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, result)) is JobState.DEAD
            dead = await store.get(job.id)
            assert dead.error is not None and "InvalidJob" in dead.error and "256 MiB" in dead.error
            assert (dead.result, dead.attempts) == (None, 1)
        claimed = await claim_one(store)
        assert claimed.id == fits.id
        assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, "fits")) is JobState.SUCCEEDED

    async def test_any_error_text_is_kept_storable(self, harness: Harness) -> None:
        """Error texts and tracebacks no log could hold are kept escaped, and cut at ``MAX_ERROR_CHARS``."""
        errors = {
            "surrogate": ("FileNotFoundError: missing caf\udce9.txt", "FileNotFoundError: missing caf\\udce9.txt"),
            "nul": ("ValueError: a\x00b", "ValueError: a\\x00b"),
        }
        long_error = "E" * (MAX_ERROR_CHARS + 500)
        cut = "E" * (MAX_ERROR_CHARS - 40) + "... (540 more characters cut)"
        first_store = harness.make()
        async with harness.session(first_store) as store:
            await store.add([harness.job(max_attempts=5) for _ in range(3)])
            ids = []
            for error in [errors["surrogate"][0], errors["nul"][0], long_error]:
                claimed = await claim_one(store)
                failed = Failed(claimed.id, claimed.epoch, error, retry_in=60.0, traceback=error)
                assert await complete_one(store, failed) is JobState.SCHEDULED
                ids.append(claimed.id)
        async with harness.session(harness.reopen(first_store)) as store:
            jobs = [await store.get(job_id) for job_id in ids]
        kept = [job.error for job in jobs]
        assert kept == [errors["surrogate"][1], errors["nul"][1], cut]
        assert [job.errors[-1].traceback for job in jobs] == kept
        assert [job.errors[-1].error for job in jobs] == kept
        assert storable_text(cut) == cut  # a text made storable once is left as it is

    async def test_subclasses_of_str_int_and_float_are_stored_as_plain_values(self, harness: Harness) -> None:
        """Fields, ids, epochs, errors and delays of builtin subclasses are taken as their plain values."""
        first_store = harness.make()
        async with harness.session(first_store) as store:
            spec = NewJob(_Str("t"), {"n": 1}, _Int(3), _Str("k"), _Int(4), _Float(0.0))
            (job,) = await store.add([spec])
            assert (type(job.task), type(job.key), type(job.priority), type(job.max_attempts)) == (str, str, int, int)
            claimed = await claim_one(store)
            failed = Failed(_Str(claimed.id), _Int(claimed.epoch), _Str("E: x"), _Float(0.0), _Str("tb"))
            assert await complete_one(store, failed) is JobState.READY
            seen = await store.get(job.id)
            assert type(seen.error) is str and type(seen.errors[0].traceback) is str
            again = await claim_one(store)
            assert await store.extend(_Str(harness.node), [(_Str(again.id), _Int(again.epoch))], 30.0) == [True]
            assert await complete_one(store, Succeeded(_Str(again.id), _Int(again.epoch), "ok")) is JobState.SUCCEEDED
            (other,) = await store.add([harness.job()])
            await store.cancel(_Str(other.id))
            await store.retry(_Str(other.id))
            before = {j: await store.get(j) for j in (job.id, other.id)}
        async with harness.session(harness.reopen(first_store)) as store:
            assert {j: await store.get(j) for j in (job.id, other.id)} == before

    @pytest.mark.parametrize("bad", [[], {"id": 1}, None, 7], ids=["list", "dict", "none", "int"])
    async def test_an_id_that_is_not_a_string_names_no_job(self, store: Store, harness: Harness, bad: object) -> None:
        """An id that is not a string raises ``JobNotFound``, and is a stale epoch to ``complete`` and ``extend``."""
        for call in (store.get, store.cancel, store.retry):
            with pytest.raises(JobNotFound):
                await call(bad)  # type: ignore[arg-type]
        assert await complete_one(store, Succeeded(bad, 1, None)) is None  # type: ignore[arg-type]
        assert await store.extend(harness.node, [(bad, 1)], 30.0) == [False]  # type: ignore[list-item]

    async def test_nesting_past_the_limit_is_refused_and_at_it_survives_a_checkpoint(self, harness: Harness) -> None:
        """Payloads and results nested past ``MAX_DEPTH`` are refused (the job, dead); at the limit they survive."""
        first_store = harness.make()
        async with harness.session(first_store) as store:
            with pytest.raises(InvalidJob, match=f"nests deeper than {MAX_DEPTH} levels") as excinfo:
                await store.add([harness.job(payload={"a": _deep(MAX_DEPTH)})])  # the dict is one level
            assert excinfo.value.field == "payload"
            too_deep, job = await store.add([harness.job(priority=1), harness.job(payload={"a": _deep(MAX_DEPTH - 1)})])
            claimed = await claim_one(store)
            assert claimed.id == too_deep.id
            assert (
                await complete_one(store, Succeeded(claimed.id, claimed.epoch, _deep(MAX_DEPTH + 1))) is JobState.DEAD
            )
            error = (await store.get(too_deep.id)).error
            assert error is not None and "nests deeper" in error
            claimed = await claim_one(store)
            assert claimed.id == job.id
            result = _deep(MAX_DEPTH - 1)
            assert await complete_one(store, Succeeded(claimed.id, claimed.epoch, result)) is JobState.SUCCEEDED
            await harness.checkpoint(store)
        async with harness.session(harness.reopen(first_store)) as store:
            kept = await store.get(job.id)
        assert kept.payload == {"a": _deep(MAX_DEPTH - 1)} and kept.result == _deep(MAX_DEPTH - 1)

    async def test_a_dict_subclass_that_says_it_is_empty_keeps_its_payload(
        self, store: Store, harness: Harness
    ) -> None:
        """A payload is what the dict holds, not what its ``len`` or ``bool`` say."""
        (job,) = await store.add([harness.job(payload=_Lying(n=1))])
        assert (await store.get(job.id)).payload == {"n": 1}

    async def test_what_a_payload_holds_is_checked_not_what_it_says_it_holds(
        self, store: Store, harness: Harness
    ) -> None:
        """A dict whose ``items`` hides a non-string key is refused all the same."""
        hiding = _Hiding({1: "an int key"})
        with pytest.raises(InvalidJob, match="keys must be strings"):
            await store.add([harness.job(payload={"inner": hiding})])
        assert await store.counts() == zero_counts()
