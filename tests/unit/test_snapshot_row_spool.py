"""The snapshot workers' spool files (row_spool.py) and COPY text split as it arrives
(copy_text.line_batches): every row back, in order, in bounded batches, whatever the sizes;
a damaged file is an error, not a short table; and spool directories a killed producer left
behind are removed by the next, never those of a producer still running."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from producer.snapshot.copy_text import CopyFormatError, line_batches
from producer.snapshot.row_spool import (
    PREFIX,
    SpoolDir,
    SpoolFormatError,
    open_spooled,
    remove_stale,
    row_batches,
    write_rows,
)


def test_rows_come_back_in_order_a_batch_as_written_at_a_time() -> None:
    rows = [b"", b"x", b"\x00\x01\x02\x03", *(b"r%d" % i for i in range(500)), b"L" * 100_000]
    spool = io.BytesIO()
    write_rows(spool, rows[:100])
    write_rows(spool, [])
    write_rows(spool, rows[100:])
    assert list(row_batches(spool)) == [rows[:100], [], rows[100:]]


def test_an_empty_spool_has_no_rows_and_a_cut_one_is_an_error() -> None:
    assert list(row_batches(io.BytesIO())) == []
    spool = io.BytesIO()
    write_rows(spool, [b"abc", b"defgh"])
    data = spool.getvalue()
    for cut in range(1, len(data)):
        with pytest.raises(SpoolFormatError, match="ends inside a batch"):
            list(row_batches(io.BytesIO(data[:cut])))


@pytest.mark.parametrize("batch_bytes", [1, 7, 64, 1 << 20])
def test_copy_text_in_blocks_of_any_size_gives_whole_rows(batch_bytes: int) -> None:
    rows = [b"%d\tv%d" % (i, i) for i in range(300)] + [b"long\t" + b"y" * 500]
    data = b"".join(r + b"\n" for r in rows)
    for cut in (1, 5, 13, 4096):  # the server's messages, or a file's reads
        blocks = [data[i : i + cut] for i in range(0, len(data), cut)]
        batches = list(line_batches(blocks, batch_bytes))
        assert [r for b in batches for r in b] == rows
        assert all(b for b in batches)
    with pytest.raises(CopyFormatError, match="newline"):
        list(line_batches([b"1\tx\n2\t", b"y"], 4))
    assert list(line_batches([])) == []


def test_a_spool_file_goes_when_it_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "range-0"
    with path.open("wb") as out:
        write_rows(out, [b"a", b"b"])
    spool = open_spooled(str(path))
    assert not path.exists()  # unlinked at once: nothing is left behind after a crash
    assert list(row_batches(spool)) == [[b"a", b"b"]]
    spool.close()


def test_a_dead_producers_spool_directory_is_removed_a_live_ones_kept(tmp_path: Path) -> None:
    # A producer killed with -9 (here: a process that made its directory, then exited).
    made = subprocess.run(
        [sys.executable, "-c",
         "import sys; from producer.snapshot.row_spool import SpoolDir; "
         f"d = SpoolDir({str(tmp_path)!r}); open(d.file('r-0'), 'wb').write(b'x' * 100); "
         "print(d.path)"],
        check=True, capture_output=True, text=True, cwd=Path(__file__).parents[2],
    ).stdout.strip()  # fmt: skip
    assert os.path.isdir(made)
    live = SpoolDir(str(tmp_path))  # its start removes the dead one's
    assert not os.path.exists(made)
    assert os.path.isdir(live.path) and os.path.basename(live.path).startswith(PREFIX)
    (tmp_path / "unrelated").mkdir()
    assert remove_stale(str(tmp_path)) == []  # a live producer's directory stays, others too
    assert os.path.isdir(live.path) and (tmp_path / "unrelated").is_dir()
    live.close()
    assert not os.path.exists(live.path)
