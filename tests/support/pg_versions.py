"""PostgreSQL of every supported major for the version matrix (no tests in this module).

The session's stack runs one major (WALBRIDGE_PG_VERSION, default 18). The others are started
here by the same `deploy/local/stack`, each in a state directory of its own under the session's
WALBRIDGE_HOME (kept between runs, so a cluster is created once), on a free port, and stopped
at the end of the session. They share the session's Kafka and registry: only the database
differs between the rows of the matrix.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, Stack
from tests.support.producer_harness import query
from tests.support.scratch_stack import ScratchStack, free_block

MAJORS = (15, 16, 17, 18)


def server_major(dsn: str) -> int:
    return int(query(dsn, "SELECT current_setting('server_version_num')::int / 10000")[0][0])


@pytest.fixture(scope="session")
def pg_dsn_of(stack: Stack, pg_dsn: str) -> Iterator[Callable[[int], str]]:
    """``pg_dsn_of(major)``: the DSN of a running PostgreSQL of that major."""
    session_home = Path(os.environ.get("WALBRIDGE_HOME", ROOT / ".walbridge"))
    session_major = server_major(pg_dsn)
    started: dict[int, tuple[ScratchStack, str]] = {}

    def dsn_of(major: int) -> str:
        if major == session_major:
            return pg_dsn
        if major not in started:
            if not stack.managed:
                pytest.fail(
                    f"the version matrix starts PostgreSQL {major} itself, which needs the "
                    "stack started by the tests (unset the WALBRIDGE_* service variables)"
                )
            # Under the session's home, not pytest's tmp (mode 0700, root's): the server runs
            # as the postgres user and must reach its data directory.
            scratch = ScratchStack(
                session_home / "pg-matrix" / str(major),
                WALBRIDGE_PG_VERSION=str(major),
                WALBRIDGE_PG_PORT=str(free_block(1)),
            )
            # A server left running there by an earlier session listens on another port.
            scratch.run("down", "postgres")
            scratch.up("postgres")
            started[major] = (scratch, scratch.exports()["WALBRIDGE_PG_DSN"])
        return started[major][1]

    yield dsn_of
    for scratch, _ in started.values():
        scratch.run("down", "postgres")


@contextmanager
def primary_and_standby(stack: Stack, major: int, name: str) -> Iterator[ScratchStack]:
    """A fresh primary and its streaming standby of one major (`WALBRIDGE_PG_STANDBY=1`), in a
    state directory of their own under the session's home; the session's Kafka and registry
    serve them. Stopped afterwards."""
    if not stack.managed:
        pytest.fail("this test starts its own PostgreSQL pair: run it with the test stack")
    home = Path(os.environ.get("WALBRIDGE_HOME", ROOT / ".walbridge")) / name / str(major)
    port = free_block(2)
    pair = ScratchStack(
        home,
        WALBRIDGE_PG_VERSION=str(major),
        WALBRIDGE_PG_STANDBY="1",
        WALBRIDGE_PG_PORT=str(port),
        WALBRIDGE_PG_STANDBY_PORT=str(port + 1),
    )
    # A pair left by an earlier run (perhaps failed over): start from a fresh primary.
    pair.run("down", "postgres", "postgres-2")
    shutil.rmtree(home / "postgres", ignore_errors=True)
    pair.up("postgres", "postgres-2")
    try:
        yield pair
    finally:
        pair.run("down", "postgres", "postgres-2")


def failover_ready(standby_dsn: str, slot: str) -> bool:
    """The standby holds the slot as a synced, persistent slot (a temporary one, not yet caught
    up with the primary's, is dropped at promotion): PostgreSQL 17's readiness check."""
    rows = query(
        standby_dsn,
        "SELECT synced AND NOT temporary AND NOT conflicting FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    )
    return bool(rows and rows[0][0])
