"""The downstream example's pure parts (examples/downstream_consumer.py): whole transactions in
commit order whatever the arrival order, redelivered copies applied once, unchanged TOAST kept
or refused, never invented."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.unit


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "examples" / "downstream_consumer.py"
    spec = importlib.util.spec_from_file_location("downstream_consumer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


dc = _load()
T = "public.orders"


def event(lsn: int, order: int, op: str, after: Any, *, before: Any = None, toast: Any = ()) -> Any:
    return {
        "before": before,
        "after": after,
        "op": op,
        "source": {"schema": "public", "table": "orders", "commit_lsn": lsn},
        "transaction": {"id": f"{lsn}:{lsn}", "total_order": order},
        "unchanged_toast": list(toast),
    }


def end(lsn: int, **counts: int) -> Any:
    return {
        "status": "END",
        "id": f"{lsn}:{lsn}",
        "commit_lsn": lsn,
        "data_collections": [
            {"data_collection": f"public.{t}", "event_count": n} for t, n in counts.items()
        ],
    }


def test_transactions_wait_for_all_their_events_and_come_out_in_commit_order() -> None:
    tx = dc.Transactions(frozenset({T}))
    tx.add_marker(end(10, orders=2, other=5))  # `other` is not read here: not waited for
    tx.add_marker(end(20, orders=1))
    tx.add_event(None, event(20, 1, "c", {"id": 2}))  # the later transaction's event first
    tx.add_event(None, event(10, 1, "c", {"id": 1}))
    assert list(tx.complete()) == []  # 10 still misses one event; 20 waits behind it
    tx.add_event(None, event(10, 2, "u", {"id": 1}))
    got = [(e["commit_lsn"], [ev["op"] for _, ev in evs]) for e, evs in tx.complete()]
    assert got == [(10, ["c", "u"]), (20, ["c"])]
    assert tx.last_commit_lsn == 20


def test_redelivered_events_and_markers_apply_once() -> None:
    tx = dc.Transactions(frozenset({T}))
    first = event(10, 1, "c", {"id": 1})
    tx.add_event(None, first)
    tx.add_event(None, first)  # a copy before the END: same (commit_lsn, total_order)
    tx.add_marker(end(10, orders=1))
    assert [len(evs) for _, evs in tx.complete()] == [1]
    # After a producer crash: the whole transaction again, markers included.
    tx.add_marker(end(10, orders=1))
    tx.add_event(None, first)
    assert list(tx.complete()) == []


def test_unchanged_toast_keeps_the_held_value_and_follows_a_key_change() -> None:
    state = dc.Tables()
    state.apply({"id": 7}, event(1, 1, "c", {"id": 7, "note": "long"}), {})
    state.apply({"id": 7}, event(2, 1, "u", {"id": 7, "note": None}, toast=["note"]), {})
    assert state.keyed[T][(("id", 7),)]["note"] == "long"
    replaced: dict[Any, Any] = {}
    state.apply({"id": 7}, event(3, 1, "d", None, before={"id": 7, "note": None}), replaced)
    moved = event(
        3, 2, "c", {"id": 100, "note": None}, before={"id": 7, "note": None}, toast=["note"]
    )
    state.apply({"id": 100}, moved, replaced)
    assert state.keyed[T] == {(("id", 100),): {"id": 100, "note": "long"}}


def test_unchanged_toast_without_a_held_value_is_refused() -> None:
    state = dc.Tables()
    with pytest.raises(dc.StreamError, match=r"unchanged TOAST column 'note' .* commit_lsn 5"):
        state.apply({"id": 1}, event(5, 1, "u", {"id": 1, "note": None}, toast=["note"]), {})
