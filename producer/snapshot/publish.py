"""A snapshot window's rows at its high watermark: each COPY line encoded (the compiled COPY
text twin, or the careful path where it gives up), the rows a change streamed inside the window
left out (by key, or whole rows for a table without a key, as many of each as the changes
say), and the rest published a batch at a time, the table's last row marked as such.

Apart from the coordinator because it only transforms the window's rows into events: it takes
no decision about the snapshot's state (the coordinator counts, logs and records what it
returns).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from producer.snapshot.copy_text import fields, spooled_batches, tuple_data
from producer.snapshot.reader import key_text
from producer.snapshot.row_spool import row_batches
from producer.snapshot.watermarks import Window, rows_to_drop
from schemas.row_encoder import copy_encoder

# The sink's ``emit_reads``: (route, [(row body, key body)], last, lsn).
EmitReads = Callable[[Any, Sequence[tuple[bytes, bytes | None]], bool, int], None]


def publish_rows(
    window: Window, route: Any, codec: Any, lsn: int, emit: EmitReads
) -> tuple[int, int, list[tuple[str, ...]]]:
    """Publishes the rows no change in the window touched; returns how many it published and
    how many it left out, and the keys of the rows to read again."""
    if window.encoded is not None and window.spool is None and route.shape.keyed:
        return _publish_encoded(window, window.encoded, route, lsn, emit)
    if window.encoded_spools:
        kept, dropped = _publish_spooled(window, route, lsn, emit)
        return kept, dropped, []
    ncols = len(window.table.columns)
    encode = codec.encode_row_key
    # The compiled COPY text twin (the careful path: split into values, then encode; it
    # raises the precise error where the twin gives up).
    fast = copy_encoder(codec.encode_row if codec.encode_key is None else encode, fields)
    keyed = route.shape.keyed
    changed = window.changed
    toast = window.toast
    # A table without a key: whole rows, as many of each as the streamed changes say.
    drop: Counter[bytes] | None = None
    batches: Iterable[list[bytes]] = (window.all_lines(),)
    if window.spool is not None:
        assert window.read_snapshot is not None  # set with the spool
        drop = rows_to_drop(window.images, window.read_snapshot)
        batches = spooled_batches(window.spool)
    dropped = kept = 0
    reread: list[bytes] = []
    # Published a batch at a time (a chunk, or a spooled batch), the last one after the
    # loop: the table's last row says "last". Each batch's last kept row waits for the
    # next batch: it is the table's last when every row after it is dropped.
    out: list[tuple[bytes, bytes | None]] = []
    for lines in batches:
        if len(out) > 1:
            emit(route, out[:-1], False, lsn)
            kept += len(out) - 1
            out = out[-1:]
        keep = out.append
        for line in lines:
            got = fast(line) if fast is not None else None
            if got is None:
                row, _toast, key = encode(tuple_data(line, ncols), lsn)
                encoded = row, key
            else:
                encoded = got
                row, key = got
            if drop is not None:
                if drop[row]:  # (a Counter: 0 for a row no change matched)
                    drop[row] -= 1
                    dropped += 1
                    continue
            elif (key if keyed else row) in changed:
                dropped += 1
                if not keyed:
                    changed.discard(row)  # one streamed change matches one read row
                elif key in toast:
                    reread.append(line)
                continue
            keep(encoded)
    kept += len(out)
    emit(route, out, not window.more and window.keys is None, lsn)
    return kept, dropped, [key_text(window.table, line) for line in reread]


def _publish_encoded(
    window: Window,
    pairs: list[tuple[bytes, bytes | None]],
    route: Any,
    lsn: int,
    emit: EmitReads,
) -> tuple[int, int, list[tuple[str, ...]]]:
    """A keyed window's rows as the snapshot workers encoded them (workers.py): only the keys
    changed inside the window are left out (none, mostly: the rows go as they are)."""
    changed, toast = window.changed, window.toast
    out = pairs
    again: list[int] = []  # rows to read again, by position
    if changed:
        out = []
        keep = out.append
        for i, pair in enumerate(pairs):
            if pair[1] in changed:
                if pair[1] in toast:
                    again.append(i)
                continue
            keep(pair)
    emit(route, out, not window.more and window.keys is None, lsn)
    lines = window.all_lines() if again else []
    return len(out), len(pairs) - len(out), [key_text(window.table, lines[i]) for i in again]


def _publish_spooled(window: Window, route: Any, lsn: int, emit: EmitReads) -> tuple[int, int]:
    """A table without a key as the snapshot workers read and encoded it (one spool file per
    block range): whole rows left out as many times as the streamed changes the read did not
    see say (as the single reader's spool is), the rest published a batch at a time, the last
    row marked as such; returns how many were published and how many left out."""
    assert window.read_snapshot is not None  # set with the spools
    drop = rows_to_drop(window.images, window.read_snapshot)
    kept = dropped = 0
    out: list[tuple[bytes, bytes | None]] = []
    for spool in window.encoded_spools:
        for rows in row_batches(spool):
            if len(out) > 1:  # the last kept row waits: it is the table's last if all after go
                emit(route, out[:-1], False, lsn)
                kept += len(out) - 1
                out = out[-1:]
            if not drop:  # no change the read did not see is left to match (mostly none)
                out.extend(zip(rows, itertools.repeat(None)))
                continue
            keep = out.append
            for row in rows:
                if drop[row]:  # (a Counter: 0 for a row no change matched)
                    drop[row] -= 1
                    dropped += 1
                    if not drop[row]:
                        del drop[row]  # (so that an empty Counter means nothing left)
                    continue
                keep((row, None))
    kept += len(out)
    emit(route, out, True, lsn)
    return kept, dropped
