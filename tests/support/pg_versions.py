"""PostgreSQL of every supported major for the version matrix (no tests in this module).

The session's stack runs one major (WALBRIDGE_PG_VERSION, default 18). The others are started
here by the same `deploy/local/stack`, each in a state directory of its own under the session's
WALBRIDGE_HOME (kept between runs, so a cluster is created once), on a free port, and stopped
at the end of the session. They share the session's Kafka and registry: only the database
differs between the rows of the matrix.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
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
            scratch.up("postgres")
            started[major] = (scratch, scratch.exports()["WALBRIDGE_PG_DSN"])
        return started[major][1]

    yield dsn_of
    for scratch, _ in started.values():
        scratch.run("down", "postgres")
