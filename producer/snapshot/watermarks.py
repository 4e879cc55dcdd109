"""One snapshot chunk between two watermarks (the DBLog method). Pure; no I/O.

The reader commits a low watermark, reads a chunk of rows in key order, then commits a high
watermark; both are logical decoding messages, so they arrive in the replication stream in
commit order with everything else. The chunk's rows show the table at some moment between
the two. While the stream goes from the low to the high watermark, every change of the table
records its key here. At the high watermark, rows whose key changed in between are dropped
(their streamed change is newer than, or the same as, what the chunk read, and it has been
published already); the rest are published inside the high watermark's transaction, so they
take its commit position: later than every change the chunk reflects, earlier than every
change it does not. Nothing pauses: the stream keeps flowing while the chunk is read.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from producer.snapshot.catalog import SnapshotTable

WATERMARK_PREFIX: Final = "walbridge.watermark"
SIGNAL_PREFIX: Final = "walbridge.signal"
INTERNAL_PREFIX: Final = "walbridge."  # never published to the message topic


class Mark(Enum):
    LOW = "low"
    HIGH = "high"


def watermark_content(window_id: str, mark: Mark) -> str:
    return json.dumps({"window": window_id, "mark": mark.value})


def parse_watermark(content: bytes) -> tuple[str, Mark] | None:
    """(window id, mark), or None for content this version did not write."""
    try:
        doc = json.loads(content)
        return str(doc["window"]), Mark(doc["mark"])
    except (ValueError, KeyError, TypeError):
        return None


class Outcome(Enum):
    PUBLISHED = "published"  # the rows went out; the cursor moves past the chunk
    TRUNCATED = "truncated"  # the table was truncated in between: nothing to publish, move on
    REDO = "redo"  # the table's shape changed in between: read the same range again


@dataclass
class Window:
    """A chunk in flight. The reader thread fills ``lines``/``more``/``cursor_after`` and sets
    ``ready`` before it commits the high watermark; the pipeline's thread does the rest."""

    table: SnapshotTable
    cursor: tuple[str, ...] | None  # the key after which this chunk starts (None: the start)
    limit: int
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lines: list[bytes] = field(default_factory=list)  # COPY text rows, in key order
    more: bool = False  # rows exist after this chunk
    cursor_after: tuple[str, ...] | None = None  # the last row's key text
    bytes_read: int = 0
    opened: bool = False  # the stream passed the low watermark
    changed: set[bytes] = field(default_factory=set)  # keys changed since the low watermark
    # Of those, keys whose change kept an unchanged TOAST value PostgreSQL did not send: the
    # streamed change lacks it, so instead of dropping the row it is read again afterwards.
    toast: set[bytes] = field(default_factory=set)
    keys: list[tuple[str, ...]] | None = None  # read these rows again (not a range)
    truncated: bool = False
    reshaped: bool = False
    ready: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def saw(self, key: bytes, unchanged_toast: bool = False) -> None:
        """A change of the table's row with this (Avro-encoded) key, after the low watermark."""
        if self.opened:
            self.changed.add(key)
            if unchanged_toast:
                self.toast.add(key)

    def outcome(self) -> Outcome:
        if self.reshaped:
            return Outcome.REDO
        if self.truncated:
            return Outcome.TRUNCATED
        return Outcome.PUBLISHED

    def keep(self, key: bytes) -> bool:
        """Whether the chunk's row with this key is published at the high watermark."""
        return key not in self.changed
