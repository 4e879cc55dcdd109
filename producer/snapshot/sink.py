"""What the snapshot coordinator needs from the pipeline: routes for a table's rows, the ``r``
and ``t`` events it publishes, and its resume records. The producer's emitter provides it.

Its own module so that the side that implements it can name it without the coordinator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from producer.snapshot.catalog import SnapshotTable
from schemas.snapshot_state import TableState


class SnapshotSink(Protocol):
    """What the coordinator needs from the pipeline."""

    def snapshot_route(self, table: SnapshotTable, lsn: int) -> Any:
        """The table's TableRoute, built from the catalog if the stream has not named it."""

    def emit_reads(
        self, route: Any, rows: Sequence[tuple[bytes, bytes | None]], last: bool, lsn: int
    ) -> None:
        """``r`` events (row body, key body) inside the current transaction, in order; with
        ``last``, the final one is the table's last."""

    def has_route(self, oid: int) -> bool:
        """Whether the table has published anything (or been described) in this run."""

    def emit_snapshot_truncate(self, route: Any, lsn: int) -> None:
        """A ``t`` event that starts the snapshot of a table without a key."""

    def write_state(self, state: TableState) -> None:
        """The table's resume record (after everything it covers is acknowledged)."""
