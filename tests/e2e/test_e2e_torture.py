"""A 3-cycle torture run (deploy/local/torture, tests/support/torture.py) against the real stack:
a kill -9 of the consumer aimed at a MERGE, the registry stopped longer than the producer's
retry interval while a column is added, and a broker kill (the producer's transaction
coordinator) together with a consumer kill aimed at the progress write (seed 3's plan). The
harness's checks must all pass: verify equal, the invariant in every progress snapshot (delta-rs),
every transaction's Kafka events equal to its END count. (That each check can fail:
tests/unit/test_torture_checks.py and test_torture_snapshots.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Stack
from tests.support import torture
from tests.support import torture_checks as tc

pytestmark = [pytest.mark.e2e, pytest.mark.torture]

SEED = 3


def test_three_torture_cycles_lose_nothing(stack: Stack, tmp_path: Path) -> None:
    if not stack.managed:
        pytest.fail("the torture run kills and restarts services: it needs the tests' own stack")
    plan = tc.schedule(SEED, 3, 25.0)
    kinds = {f.kind for c in plan for f in c.faults}
    assert kinds == {
        tc.Kind.CONSUMER_KILL_MERGE,
        tc.Kind.REGISTRY_STOP,
        tc.Kind.BROKER_KILL,
        tc.Kind.CONSUMER_KILL_PROGRESS,
    }
    report = torture.run(
        torture.Options(
            cycles=3,
            seconds_per_cycle=25.0,
            seed=SEED,
            report=tmp_path / "torture.json",
            work_dir=tmp_path / "work",
        ),
        stack_env=dict(os.environ),
    )
    assert (tmp_path / "torture.json").exists()
    assert report["cycles"] == 3
    assert report["verify_equal"], report["problems"]["verify"]
    assert (report["lost"], report["diverged"]) == (0, 0)
    assert report["invariant_violations"] == 0, report["problems"]["invariant"]
    assert report["end_mismatches"] == 0, report["problems"]["end_counts"]
    assert report["errors"] == [], report["errors"]
    assert report["snapshots_checked"] >= 3
    assert report["transactions"] > 100
    assert report["aims"]["attempts"] == 2
    assert report["workload"]["columns_added"]  # the schema changed during the run
    assert report["passed"], report["summary"]
