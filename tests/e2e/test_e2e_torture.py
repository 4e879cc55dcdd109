"""A 3-cycle torture run (deploy/local/torture, tests/support/torture.py) against the real stack,
one fault of each family (those three kinds chosen; seed 48053 orders them): a 6 s partition of the
consumer's link to Kafka (Toxiproxy, through the brokers' proxied listeners), a PostgreSQL crash
(pg_ctl stop -m immediate, then start) and a kill -9 of the consumer aimed at a MERGE, with a
column added on the way. Every cycle must count (the consumer committed a batch since the
previous fault) and the harness's checks must all pass: verify equal, the invariant in every
progress snapshot (delta-rs), every transaction's Kafka events equal to its END count. The
consumer kill comes last, so no cycle waits for a consumer's restart. (That each check can
fail: tests/unit/test_torture_checks.py and test_torture_snapshots.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Stack
from tests.support import torture
from tests.support import torture_checks as tc

pytestmark = [pytest.mark.e2e, pytest.mark.torture]

SEED = 48053
FAULTS = ("net_partition", "postgres_crash", "consumer_kill_merge")
CYCLES = 3
SECONDS_PER_CYCLE = 20.0


def test_three_torture_cycles_lose_nothing(stack: Stack, tmp_path: Path) -> None:
    if not stack.managed:
        pytest.fail("the torture run kills and restarts services: it needs the tests' own stack")
    plan = tc.schedule(SEED, CYCLES, SECONDS_PER_CYCLE, FAULTS)
    faults = [c.faults for c in plan]
    assert all(len(f) == 1 for f in faults)
    kinds = [f[0].kind for f in faults]
    assert kinds == [tc.Kind.NET_PARTITION, tc.Kind.POSTGRES_CRASH, tc.Kind.CONSUMER_KILL_MERGE]
    assert faults[0][0].link == "consumer_kafka"
    assert [tc.FAMILIES[k] for k in kinds] == ["network", "postgres", "process"]
    report = torture.run(
        torture.Options(
            cycles=CYCLES,
            seconds_per_cycle=SECONDS_PER_CYCLE,
            seed=SEED,
            faults=FAULTS,
            report=tmp_path / "torture.json",
            work_dir=tmp_path / "work",
            # Generous bounds, spent only when the machine is slow: at a load average of 45 a
            # batch took 196 s and a cold consumer's first one 305 s, so a restarted consumer's
            # catch-up can pass the CLI's 600 s while nothing is wrong.
            recovery_timeout_s=1500.0,
            commit_wait_s=900.0,
        ),
        stack_env=dict(os.environ),
    )
    assert (tmp_path / "torture.json").exists()
    assert report["cycles_run"] == CYCLES
    assert report["cycles"] == CYCLES, report["cycle_results"]  # every cycle counted
    assert report["verify_equal"], report["problems"]["verify"]
    assert (report["lost"], report["diverged"]) == (0, 0)
    assert report["invariant_violations"] == 0, report["problems"]["invariant"]
    assert report["end_mismatches"] == 0, report["problems"]["end_counts"]
    assert report["errors"] == [], report["errors"]
    assert report["snapshots_checked"] >= 3
    assert report["transactions"] > 100
    assert report["aims"]["attempts"] == 1
    assert report["workload"]["columns_added"]  # the schema changed during the run
    per_kind = report["per_kind"]
    assert set(per_kind) == {k.value for k in kinds}
    for kind, figures in per_kind.items():
        assert figures["cycles"] == 1, (kind, figures)
        assert figures["recovery_max_s"] is not None, (kind, figures)
    partition = report["cycle_results"][0]["details"][0]
    assert partition == {"network": "partition", "link": "consumer_kafka", "held_s": 6.2}
    assert "per_kind[" in report["summary"] and "longest_recovery_s=" in report["summary"]
    assert report["passed"], report["summary"]
