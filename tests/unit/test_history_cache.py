"""The SDK's kept histories: what an invocation with a base is completed with, when the whole
history is fetched instead, how much is kept, and that kept results are never handed out."""

from __future__ import annotations

from typing import Any

import pytest

from stepline import protocol
from stepline._history import HistoryCache, size_of, thaw

RUN = "01900000-0000-7000-8000-000000000001"


def record(name: str, position: int, status: str = "completed", output: Any = None) -> Any:
    return protocol.StepRecord.model_validate(
        {"name": name, "kind": "run", "status": status, "position": position, "output": output}
    )


def request(
    invocation: str, steps: list[Any], base: str | None = None, generation: int = 1
) -> protocol.InvokeRequest:
    return protocol.InvokeRequest.model_validate(
        {
            "runId": RUN,
            "workflow": "wf",
            "invocationId": invocation,
            "token": "t",
            "apiUrl": "http://127.0.0.1:9",
            "steps": [s.model_dump(by_alias=True) for s in steps],
            "historyBase": base,
            "generation": generation,
        }
    )


class Fetches:
    """The orchestrator's answer to a history fetch, noting each one."""

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps
        self.asked: list[str] = []

    async def __call__(self, req: protocol.InvokeRequest) -> list[protocol.StepRecord]:
        self.asked.append(req.invocation_id)
        return list(self.steps)


def names(req: protocol.InvokeRequest) -> list[tuple[str, str, Any]]:
    return [(s.name, s.status.value, s.output) for s in req.steps]


async def test_changes_are_laid_over_the_history_of_the_base() -> None:
    cache = HistoryCache()
    never = Fetches([])
    first = await cache.complete(request("i1", [record("a", 1), record("b", 2, "sleeping")]), never)
    assert names(first) == [("a", "completed", None), ("b", "sleeping", None)]
    second = await cache.complete(
        request("i2", [record("b", 2), record("c", 3, output={"x": 1})], base="i1"), never
    )
    assert names(second) == [
        ("a", "completed", None),
        ("b", "completed", None),
        ("c", "completed", {"x": 1}),
    ]
    assert second.history_base is None
    third = await cache.complete(request("i3", [], base="i2"), never)
    assert [s.name for s in third.steps] == ["a", "b", "c"]
    assert never.asked == [] and cache.fetches == 0


@pytest.mark.parametrize(
    ("kept_as", "base", "generation"),
    [("i1", "i0", 1), ("i1", "i1", 2)],
    ids=["another base", "another generation"],
)
async def test_a_base_not_kept_fetches_the_whole_history(
    kept_as: str, base: str, generation: int
) -> None:
    cache = HistoryCache()
    whole = Fetches([record("a", 1), record("b", 2)])
    await cache.complete(request(kept_as, [record("old", 1)]), whole)
    got = await cache.complete(request("i2", [record("b", 2)], base, generation), whole)
    assert [s.name for s in got.steps] == ["a", "b"]
    assert whole.asked == ["i2"] and cache.fetches == 1
    again = await cache.complete(request("i3", [], base="i2", generation=generation), whole)
    assert [s.name for s in again.steps] == ["a", "b"] and whole.asked == ["i2"]


async def test_the_least_recently_used_histories_go_past_the_budget() -> None:
    one = record("a", 1, output="x" * 1000)
    cache = HistoryCache(max_bytes=size_of(one) * 2)
    whole = Fetches([one])
    for n in range(3):
        req = request("i1", [one]).model_copy(update={"run_id": f"run-{n}"})
        await cache.complete(req, whole)
    assert len(cache) == 2 and cache.size == size_of(one) * 2
    forgotten = request("i2", [], base="i1").model_copy(update={"run_id": "run-0"})
    await cache.complete(forgotten, whole)
    assert whole.asked == ["i2"]  # run-0 went first: its history was fetched
    cache.forget("run-0")
    assert len(cache) == 1


async def test_a_budget_of_nothing_keeps_nothing() -> None:
    cache = HistoryCache(max_bytes=0)
    whole = Fetches([])
    await cache.complete(request("i1", []), whole)
    await cache.complete(request("i2", [], base="i1"), whole)
    assert whole.asked == ["i2"] and len(cache) == 0


def test_thaw_copies_containers_all_the_way_down() -> None:
    value = {"a": [1, {"b": [2]}], "c": "s"}
    copy = thaw(value)
    assert copy == value
    copy["a"][1]["b"].append(3)
    copy["a"].append(4)
    assert value == {"a": [1, {"b": [2]}], "c": "s"}


def test_a_record_counts_its_name_result_error_and_the_rest() -> None:
    """160 bytes for the record, plus its name, its result's JSON, its error's message and
    traceback."""
    bare = record("ab", 1)
    assert size_of(bare) == 160 + 2
    assert size_of(record("ab", 1, output={"k": 1})) == 160 + 2 + len('{"k":1}')
    failed = protocol.StepRecord.model_validate(
        {"name": "ab", "kind": "run", "status": "failed", "position": 1,
         "error": {"type": "E", "message": "boom", "traceback": "trace!"}}
    )  # fmt: skip
    assert size_of(failed) == 160 + 2 + 4 + 6


async def test_a_changed_step_replaces_its_bytes_and_each_fetch_is_counted() -> None:
    """A step that changes in a later invocation counts once, at its new size; the cache
    keeps a history exactly its budget; each whole history fetched is counted."""
    first, done = record("a", 1, "running"), record("a", 1, output="x" * 50)
    cache = HistoryCache(max_bytes=size_of(done))
    never = Fetches([])
    await cache.complete(request("i1", [first]), never)
    assert cache.size == size_of(first)
    await cache.complete(request("i2", [done], base="i1"), never)
    assert cache.size == size_of(done) and len(cache) == 1 and never.asked == []
    fetch = Fetches([done])
    await cache.complete(request("i3", [], base="elsewhere"), fetch)
    await cache.complete(request("i4", [], base="elsewhere"), fetch)
    assert cache.fetches == 2 and fetch.asked == ["i3", "i4"]
    assert cache.size == size_of(done)


async def test_an_empty_history_is_kept_under_the_smallest_budget() -> None:
    """A run with no steps yet weighs nothing: a budget of one byte keeps it, so the next
    invocation building on it fetches nothing."""
    cache = HistoryCache(max_bytes=1)
    never = Fetches([])
    await cache.complete(request("i1", []), never)
    await cache.complete(request("i2", [], base="i1"), never)
    assert never.asked == [] and cache.fetches == 0 and len(cache) == 1
