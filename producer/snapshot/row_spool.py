"""Encoded rows spooled to files: the snapshot workers write a table without a key's rows there,
Avro-encoded, one file per block range, and the producer publishes them from there in bounded
batches, so neither side holds a whole table in memory.

A file is a sequence of frames, each a row body's length (4 bytes, little-endian) and the
body. Why not the COPY text, as the single-reader path spools it: encoding is the work the
workers are there to share; the producer then only frames and produces.

The files live in one directory per producer (``SpoolDir``), removed when the producer stops.
A producer killed with -9 leaves its directory behind; the next one to start a spool directory
in the same place removes it (a directory whose lock no process holds), so a crash loop
does not fill the disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import BinaryIO, Final

PREFIX: Final = "walbridge-snapshot-spool-"
_LOCK: Final = ".lock"
_LENGTH: Final = 4


class SpoolFormatError(ValueError):
    """A spool file that does not hold whole frames (a bug, or the file was damaged)."""


def write_rows(out: BinaryIO, rows: Iterable[bytes]) -> None:
    out.write(b"".join(len(r).to_bytes(_LENGTH, "little") + r for r in rows))


def row_batches(spool: BinaryIO, block_size: int = 4 * 1024 * 1024) -> Iterator[list[bytes]]:
    """The rows of a spool file, from its start, in batches of about ``block_size`` bytes (and
    at most one row longer than that, read whole)."""
    spool.seek(0)
    rest = b""
    while block := spool.read(block_size):
        data = rest + block if rest else block
        rows: list[bytes] = []
        pos, n = 0, len(data)
        while n - pos >= _LENGTH:
            end = pos + _LENGTH + int.from_bytes(data[pos : pos + _LENGTH], "little")
            if end > n:
                if end - n > block_size:  # a long row: the rest of it in one read
                    data += spool.read(end - n)
                    n = len(data)
                    if end > n:
                        break
                else:
                    break
            rows.append(data[pos + _LENGTH : end])
            pos = end
        rest = data[pos:]
        if rows:
            yield rows
    if rest:
        raise SpoolFormatError(f"spool {getattr(spool, 'name', '?')!r} ends inside a row")


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
