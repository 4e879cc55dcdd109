"""ColumnCache: an expression is built once per key, whichever thread asks first."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from spark_consumer.column_cache import ColumnCache

pytestmark = pytest.mark.unit


def test_a_value_is_built_once_per_key() -> None:
    cache = ColumnCache()
    calls: list[str] = []

    def build(name: str) -> list[str]:
        calls.append(name)
        return [name]

    first = cache.get(("events", 7, ("id",)), lambda: build("a"))
    again = cache.get(("events", 7, ("id",)), lambda: build("b"))
    other = cache.get(("events", 8, ("id",)), lambda: build("c"))
    assert first is again and first == ["a"]
    assert other == ["c"]
    assert calls == ["a", "c"]


def test_threads_racing_on_a_key_all_get_the_value_stored_first() -> None:
    cache = ColumnCache()
    start = threading.Barrier(8)

    def get(i: int) -> object:
        start.wait()
        return cache.get("markers", lambda: object())

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(get, range(8)))
    assert all(g is got[0] for g in got)
