"""The consumer's between-batch maintenance schedule (maintenance_runner.Maintainer), with the
Delta commands replaced by recorders: what runs after which batch, within the budget."""

from __future__ import annotations

from typing import Any

import pytest

from spark_consumer import lake_state, maintenance, maintenance_runner
from spark_consumer.config import ConsumerConfig
from spark_consumer.lake_state import LakeTable

pytestmark = pytest.mark.unit

LAKE = "/lake"
T = f"{LAKE}/public/t"
PROGRESS = f"{LAKE}/_walbridge/progress"
PENDING = f"{LAKE}/_walbridge/pending"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def done(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    ran: list[tuple[str, str]] = []
    monkeypatch.setattr(maintenance, "compact", lambda s, p, t: ran.append(("compact", p)) or True)
    monkeypatch.setattr(maintenance, "vacuum", lambda s, p, r: ran.append(("vacuum", p)) or True)
    monkeypatch.setattr(
        maintenance, "expire_progress", lambda s, p, r: ran.append(("expire", p)) and None
    )
    monkeypatch.setattr(maintenance, "pending_may_vacuum", lambda s, p, named: named is None)
    monkeypatch.setattr(lake_state, "read", lambda s, p: LakeTable(p, 3, files=2, size=100))
    return ran


def maintainer(files: dict[str, int], clock: Clock, **settings: Any) -> Any:
    config = ConsumerConfig(
        kafka_bootstrap="-",
        schema_registry_url="mock://x",
        topic_prefix="p",
        lake_path=LAKE,
        lake_small_files_max=4,
        lake_consistent_read_retention=40.0,  # VACUUM every 10 s
        **settings,
    )
    forgotten: list[str] = []
    m = maintenance_runner.Maintainer(
        None,  # type: ignore[arg-type]
        config,
        lambda p: LakeTable(p, 7, files=files[p], size=1000),
        forgotten.append,
        clock=clock,
    )
    m.forgotten = forgotten
    return m


def test_compaction_when_files_pile_up_then_vacuum_on_its_cadence(
    done: list[tuple[str, str]],
) -> None:
    clock, files = Clock(), {T: 2}
    m = maintainer(files, clock, lake_maintenance_budget=1.0)
    m.request([T, PROGRESS], None)
    m.run(1.0)
    assert done == []  # 2 files: nothing due, VACUUM not before 10 s
    files[T] = 5  # 1 needed + 4 small
    clock.now += 11
    m.request([T, PROGRESS], None)
    m.run(30.0)
    assert done == [
        ("compact", T),
        ("vacuum", T),
        ("expire", PROGRESS),
        ("vacuum", PROGRESS),
    ]
    assert m.forgotten == [T, T, PROGRESS]  # what the MERGEs knew of them is stale


def test_the_budget_bounds_what_runs_after_a_batch(
    done: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, files = Clock(), {T: 9}
    m = maintainer(files, clock, lake_maintenance_budget=0.1)
    slow = 5.0

    def compact(s: object, p: str, t: int) -> bool:
        done.append(("compact", p))
        m.budget.spend(slow)  # as if it took 5 s (the runner adds the real, tiny time)
        return True

    monkeypatch.setattr(maintenance, "compact", compact)
    clock.now += 11
    m.request([T], None)
    m.run(2.0)  # earns 0.2 s: one operation starts, overspends
    assert done == [("compact", T)]
    m.request([T], None)
    for _ in range(20):
        m.run(2.0)  # 20 batches of 2 s repay 4 of the 4.8 s: still in debt, nothing starts
    assert done == [("compact", T)]
    for _ in range(5):
        m.run(2.0)  # out of debt after 4 or 5 more: the waiting compaction runs
    assert done == [("compact", T)] * 2


def test_no_maintenance_with_a_zero_budget_and_pending_kept_for_a_rerun(
    done: list[tuple[str, str]],
) -> None:
    clock = Clock()
    off = maintainer({T: 50}, clock, lake_maintenance_budget=0.0)
    off.request([T], None)
    off.run(100.0)
    assert done == [] and not off.enabled
    m = maintainer({T: 1, PENDING: 1}, clock, lake_maintenance_budget=1.0, lake_compaction=False)
    m.request([PENDING], 5)  # the latest progress row names pending version 5
    clock.now += 11
    m.run(100.0)
    assert done == []  # pending_may_vacuum said no: version 5 must stay for a restart
