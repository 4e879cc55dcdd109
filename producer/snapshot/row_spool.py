"""Encoded rows spooled to files: the snapshot workers write a table without a key's rows there,
Avro-encoded, one file per block range, and the producer publishes them from there in bounded
batches, so neither side holds a whole table in memory.

A file is a sequence of batches, each its row count, its rows' lengths and its rows' bodies
(counts and lengths 4 bytes, little-endian). Why not the COPY text, as the single-reader path
spools it: encoding is the work the workers are there to share; the producer then only frames
and produces.

The files live in one directory per producer (``SpoolDir``), removed when the producer stops.
A producer killed with -9 leaves its directory behind; the next one to start a spool directory
in the same place removes it (a directory whose lock no process holds), so a crash loop
does not fill the disk.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import BinaryIO, Final

PREFIX: Final = "walbridge-snapshot-spool-"
_LOCK: Final = ".lock"
_LENGTH: Final = 4
# The array typecode of 4-byte unsigned integers ("I" on every platform CPython runs on here).
_LENGTHS: Final = next(c for c in "IL" if array.array(c).itemsize == _LENGTH)


class SpoolFormatError(ValueError):
    """A spool file that does not hold whole batches (a bug, or the file was damaged)."""


def write_rows(out: BinaryIO, rows: Sequence[bytes]) -> None:
    """One batch: its row count, the rows' lengths (4 bytes each) and the rows, back to back."""
    lengths = array.array(_LENGTHS, map(len, rows))
    if sys.byteorder != "little":
        lengths.byteswap()
    out.write(len(rows).to_bytes(_LENGTH, "little"))
    out.write(lengths.tobytes())
    out.write(b"".join(rows))


def row_batches(spool: BinaryIO) -> Iterator[list[bytes]]:
    """The rows of a spool file, from its start, a batch as it was written at a time.

    Why a batch's lengths come first instead of one before each row: the producer's thread
    reads these, and an array of lengths read in C and one slice per row cost it less than
    parsing a length before each row in Python (with the publisher's loop skipped where no
    change is left to match, 2.02 -> 1.72 us per row of main thread, bench_snapshot.py
    --keyless)."""
    spool.seek(0)
    while header := spool.read(_LENGTH):
        count = int.from_bytes(_exactly(spool, header, _LENGTH), "little")
        lengths = array.array(_LENGTHS)
        lengths.frombytes(_exactly(spool, spool.read(_LENGTH * count), _LENGTH * count))
        if sys.byteorder != "little":
            lengths.byteswap()
        ends = list(itertools.accumulate(lengths))
        size = ends[-1] if ends else 0
        data = _exactly(spool, spool.read(size), size)
        yield [data[a:b] for a, b in zip([0, *ends], ends, strict=False)]


def _exactly(spool: BinaryIO, data: bytes, size: int) -> bytes:
    if len(data) != size:
        raise SpoolFormatError(f"spool {getattr(spool, 'name', '?')!r} ends inside a batch")
    return data


def open_spooled(path: str) -> BinaryIO:
    """A worker's spool file, opened and unlinked at once: it goes when it is closed."""
    spool = open(path, "rb")  # noqa: SIM115 (the window owns it)
    os.unlink(path)
    return spool


class SpoolDir:
    """The workers' spool files' directory, created under ``parent`` (the system's temporary
    directory by default) and locked while this process lives."""

    def __init__(self, parent: str | None = None) -> None:
        base = parent or tempfile.gettempdir()
        remove_stale(base)
        self.path = tempfile.mkdtemp(prefix=PREFIX, dir=base)
        self._lock = open(os.path.join(self.path, _LOCK), "wb")  # noqa: SIM115 (held until close)
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()


def remove_stale(base: str) -> list[str]:
    """Removes the spool directories under ``base`` that no live process holds; returns them."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(base) as entries:
        for entry in entries:
            if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                lock = open(os.path.join(entry.path, _LOCK), "rb")  # noqa: SIM115
            except OSError:
                continue  # (being created: its lock file comes next)
            with lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # held: its producer runs
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed
