"""Fuzz the pgoutput decoder and its fast path with generated payloads.

    .walbridge/venv/bin/python -m tests.fuzz.pgoutput_fuzz --messages 1000000 --seed 1

Each payload goes through `Decoder.decode` (in a stream or not) and, when its tag has a fast
parser, through both the fast parser and the careful one. A finding is: any exception other
than `DecodeError` (the decoder's documented error), a `DecodeError` whose offset lies outside
the payload, a fast parser that accepts or rejects differently from the careful one (a
different message, or a different error type, offset or kind), a generated valid message that
does not decode back to itself, or one payload taking longer than `--slow-s`. A watchdog
(faulthandler) ends the run with a traceback if a chunk of payloads hangs.

Payloads come from three sources, drawn at random (one seeded `random.Random`, so a run is
repeatable):
- mutations of real captures (tests/fuzz/corpus/pgoutput.txt, from capture_pgoutput.py): bytes
  overwritten, flipped, inserted, deleted, truncated, extended, length fields set to edge
  values, splices of two payloads, the tag swapped for another;
- structure-aware generation: a pool of messages drawn from the Hypothesis strategies of the
  round-trip tests (tests/support/pgoutput_strategies.py), encoded by the independent test
  encoder, sent as they are (they must decode back to themselves) or mutated as above;
- a known tag followed by random bytes.
A fourth target is the producer's TupleData fast path (`schemas/row_encoder.py`'s `wire` twin,
which encodes an Insert's tuple straight from the payload): Insert payloads of a table with one
column of each edge value of the type table (tests/unit/test_schemas_convert.py, text and binary),
NULLs and unchanged TOAST, their tuples mutated; the twin must never raise, and whenever it
reaches the payload's end its (row, unchanged TOAST, key) bytes must equal what decoding the
payload and encoding the decoded tuple give (it may give up: the careful path then decides).
A fifth target is the snapshot's COPY text twin of the same encoders (`row_encoder.copy_encoder`,
which encodes a `COPY ... TO STDOUT` text row straight from its bytes): rows of the same table in
COPY's text form (NULLs, escapes), mutated; the twin must never raise, and whenever it encodes a
row, (row, key) must equal what the careful path gives (split and unescape, then the encoder), and
the careful path must accept it.
Findings are written as `<in_stream> <hex>` lines to --findings; the exit status is 1 if any.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import random
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from producer.pgoutput import DecodeError, Decoder, PgOutputMessage, StreamStart
from producer.pgoutput.fastpath import FAST_PARSERS
from producer.pgoutput.parsers import PARSERS, run_careful
from tests.support.pgoutput_encoder import encode
from tests.support.pgoutput_strategies import streamable, u32, unstreamed

CORPUS = Path(__file__).resolve().parent / "corpus" / "pgoutput.txt"
TAGS = sorted(PARSERS)
# Values that break length and count fields: zero, one, sign bits, all ones.
EDGE_32 = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)
EDGE_16 = (0, 1, 0x7FFF, 0x8000, 0xFFFF)


def load_corpus(path: Path = CORPUS) -> list[tuple[bytes, bool]]:
    """(payload, in_stream) per captured payload; in_stream follows each option set's own
    sequence of Stream Start / Stream Stop, as the walsender sent it."""
    out: list[tuple[bytes, bool]] = []
    decoders: dict[str, Decoder] = {}
    for line in path.read_text().splitlines():
        label, hexed = line.split(" ", 1)
        payload = bytes.fromhex(hexed)
        decoder = decoders.setdefault(label, Decoder())
        in_stream = decoder.stream_xid is not None
        decoder.decode(payload)  # real captures must decode: a failure here is a decoder bug
        out.append((payload, in_stream))
    return out


def structured_pool(size: int, seed: int) -> list[tuple[bytes, bool, PgOutputMessage]]:
    """`size` messages drawn from the round-trip strategies, encoded: (payload, in_stream,
    message). Drawn once through Hypothesis' own engine (a @given run that records what it
    draws), then reused: Hypothesis takes about a millisecond per example, the loop microseconds."""
    pool: list[tuple[bytes, bool, PgOutputMessage]] = []
    strategy = st.one_of(
        st.tuples(st.one_of(unstreamed, streamable(st.none())), st.just(False)),
        st.tuples(streamable(u32), st.just(True)),
    )

    @settings(
        max_examples=size,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(strategy)
    def record(case: tuple[PgOutputMessage, bool]) -> None:
        message, in_stream = case
        pool.append((encode(message, in_stream=in_stream), in_stream, message))

    del seed  # derandomize: Hypothesis' draws are fixed; the mutations use the run's seed
    record()
    return pool


class Mutator:
    def __init__(self, rng: random.Random, donors: list[bytes]) -> None:
        self.rng = rng
        self.donors = donors

    def __call__(self, payload: bytes) -> bytes:
        rng = self.rng
        data = bytearray(payload)
        for _ in range(rng.choice((1, 1, 1, 2, 3, 5))):
            action = rng.randrange(10)
            at = rng.randrange(len(data) + 1)
            if action == 0 and data:  # overwrite one byte
                data[min(at, len(data) - 1)] = rng.randrange(256)
            elif action == 1 and data:  # flip one bit
                i = min(at, len(data) - 1)
                data[i] ^= 1 << rng.randrange(8)
            elif action == 2:  # truncate
                del data[at:]
            elif action == 3:  # extend
                data += rng.randbytes(rng.randrange(1, 9))
            elif action == 4:  # insert
                data[at:at] = rng.randbytes(rng.randrange(1, 5))
            elif action == 5 and data:  # delete a few bytes
                del data[at : at + rng.randrange(1, 5)]
            elif action == 6 and at + 4 <= len(data):  # a 32-bit length/count at an edge
                struct.pack_into("!I", data, at, rng.choice(EDGE_32))
            elif action == 7 and at + 2 <= len(data):  # a 16-bit column count at an edge
                struct.pack_into("!H", data, at, rng.choice(EDGE_16))
            elif action == 8 and self.donors:  # splice: our head, another payload's tail
                donor = rng.choice(self.donors)
                data = data[:at] + donor[rng.randrange(len(donor) + 1) :]
            elif action == 9 and data:  # another message type's tag on this body
                data[0] = rng.choice(TAGS)
        return bytes(data)


class WireTarget:
    """The TupleData fast path of one many-typed table, and Insert payloads for it."""

    def __init__(self, rng: random.Random) -> None:
        from producer.pgoutput import UNCHANGED_TOAST, Column, Relation, Value
        from schemas import row_encoder
        from schemas.relation import build_relation_codec
        from schemas.type_catalog import TypeCatalog
        from tests.unit.test_schemas_convert import CASES  # every mapped type's edge values

        labels = sorted(CASES)
        columns = (
            Column(1, "id", 20, -1, True),
            *(Column(0, f"c{i}", CASES[k][0], CASES[k][1], False) for i, k in enumerate(labels)),
        )
        relation = Relation(None, 1, "public", "t", "d", columns)
        self.codec = build_relation_codec(relation, TypeCatalog(), "db.public.t")
        wire = row_encoder.wire_encoder(self.codec.encode_row_key)
        assert wire is not None
        self.wire = wire
        self.rng = rng
        self.key = Value(b"42", False)
        self.text = [Value(CASES[k][2], False) for k in labels]
        self.binary = [Value(CASES[k][3], True) for k in labels]
        self.toast = UNCHANGED_TOAST

    def payload(self) -> bytes:
        rng = self.rng
        values: list[Any] = []
        for text, binary in zip(self.text, self.binary, strict=True):
            roll = rng.random()
            values.append(
                text
                if roll < 0.6
                else binary
                if roll < 0.85
                else None
                if roll < 0.95
                else self.toast
            )
        from producer.pgoutput import Insert

        return encode(Insert(None, 1, (self.key, *values)))


_COPY_ESCAPES = {
    ord("\\"): b"\\\\",
    ord("\n"): b"\\n",
    ord("\r"): b"\\r",
    ord("\t"): b"\\t",
    ord("\b"): b"\\b",
    ord("\f"): b"\\f",
    ord("\v"): b"\\v",
}


class CopyTarget:
    """The COPY text twin of the wire target's table, and COPY text rows for it."""

    def __init__(self, wire: WireTarget) -> None:
        from producer.snapshot.copy_text import fields
        from schemas import row_encoder

        self.codec = wire.codec
        self.width = len(wire.codec.columns)
        twin = row_encoder.copy_encoder(wire.codec.encode_row_key, fields)
        assert twin is not None
        self.twin = twin
        self.rng = wire.rng
        self.texts = [v.data for v in wire.text]
        # Text columns take any character (others would refuse the spliced ones).
        self.free = [c.pg_type == "text" for c in wire.codec.columns[1:]]

    def row(self) -> bytes:
        rng = self.rng
        values: list[bytes] = [b"42"]
        for text, free in zip(self.texts, self.free, strict=True):
            roll = rng.random()
            if roll < 0.05:
                values.append(b"\\N")
            else:
                if free and roll < 0.5:  # characters COPY escapes, spliced in
                    at = rng.choice((0, len(text)))  # not inside a UTF-8 sequence
                    text = text[:at] + rng.choice((b"\\", b"\t", b"\n", b"\r", b"\x08")) + text[at:]
                values.append(b"".join(_COPY_ESCAPES.get(b, bytes([b])) for b in text))
        return b"\t".join(values)


def check_copy(target: CopyTarget, line: bytes, stats: Stats) -> str | None:
    """The COPY text twin's answer for ``line`` against the careful path's."""
    from producer.snapshot.copy_text import tuple_data

    stats.copy_compared += 1
    try:
        result = target.twin(line)
    except Exception as exc:
        return f"copy twin raised {type(exc).__name__}: {exc}"
    if result is None:
        return None  # gave up: the careful path decides
    stats.copy_accepted += 1
    try:
        row, _toast, key = target.codec.encode_row_key(tuple_data(line, target.width))
    except Exception as exc:
        return f"copy twin accepted what the careful path refuses: {type(exc).__name__}: {exc}"
    if tuple(result) != (row, key):
        return f"copy twin {result!r} != careful {(row, key)!r}"
    return None


def check_wire(target: WireTarget, payload: bytes, stats: Stats) -> str | None:
    """The fast path's answer for ``payload`` (TupleData at offset 6) against the careful one."""
    stats.wire_compared += 1
    try:
        result = target.wire(payload, 6)
    except Exception as exc:
        return f"wire twin raised {type(exc).__name__}: {exc}"
    if result is None or result[3] != len(payload):
        return None  # gave up, or stopped short of the end: the careful path decides
    stats.wire_accepted += 1
    try:
        message = Decoder().decode(payload)
    except DecodeError as error:
        return f"wire twin accepted what the decoder refuses: {error}"
    new = getattr(message, "new", None)
    if new is None:
        return f"wire twin accepted a {type(message).__name__}"
    try:
        careful = target.codec.encode_row_key(new)
    except Exception as exc:
        return f"wire twin accepted what the encoder refuses: {type(exc).__name__}: {exc}"
    if tuple(result[:3]) != tuple(careful):
        return f"wire twin {result[:3]!r} != careful {careful!r}"
    return None


@dataclass
class Stats:
    messages: int = 0
    decoded: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # DecodeError kinds
    sources: Counter[str] = field(default_factory=Counter)
    fast_compared: int = 0
    wire_compared: int = 0  # TupleData fast path runs
    wire_accepted: int = 0  # of which it reached the end (and was compared)
    copy_compared: int = 0  # COPY text twin runs
    copy_accepted: int = 0  # of which it encoded the row (and was compared)
    round_trips: int = 0
    findings: int = 0
    max_ms: float = 0.0
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "decoded": self.decoded,
            "decode_errors": sum(self.errors.values()),
            "decode_errors_by_kind": dict(sorted(self.errors.items())),
            "by_source": dict(sorted(self.sources.items())),
            "fast_path_compared": self.fast_compared,
            "tuple_fast_path_runs": self.wire_compared,
            "tuple_fast_path_compared": self.wire_accepted,
            "copy_twin_runs": self.copy_compared,
            "copy_twin_compared": self.copy_accepted,
            "round_trips": self.round_trips,
            "findings": self.findings,
            "max_ms_per_message": round(self.max_ms, 3),
            "seconds": round(self.seconds, 1),
            "messages_per_s": round(self.messages / self.seconds) if self.seconds else 0,
        }


def _outcome(
    parse: Callable[[bytes, bool], PgOutputMessage], payload: bytes, in_stream: bool
) -> Any:
    try:
        return parse(payload, in_stream)
    except DecodeError as error:
        return ("error", error.message_type, error.offset, error.kind)


def _decoder(in_stream: bool) -> Decoder:
    decoder = Decoder()
    if in_stream:
        decoder.decode(encode(StreamStart(77, True)))
    return decoder


def check(
    payload: bytes, in_stream: bool, stats: Stats, expected: PgOutputMessage | None = None
) -> str | None:
    """Run one payload through the decoder (and both paths); the finding, or None."""
    try:
        message = _decoder(in_stream).decode(payload)
    except DecodeError as error:
        stats.errors[error.kind.value] += 1
        if not 0 <= error.offset <= len(payload):
            return f"DecodeError offset {error.offset} outside a {len(payload)}-byte payload"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    else:
        stats.decoded += 1
        if expected is not None:
            stats.round_trips += 1
            if message != expected:
                return f"round trip: decoded {message!r}, encoded {expected!r}"
    if payload and payload[0] in FAST_PARSERS:
        tag = payload[0]
        stats.fast_compared += 1
        try:
            fast = _outcome(FAST_PARSERS[tag], payload, in_stream)
            careful = _outcome(lambda p, s: run_careful(tag, p, s), payload, in_stream)
        except Exception as exc:
            return f"fast/careful raised {type(exc).__name__}: {exc}"
        if fast != careful:
            return f"fast path {fast!r} != careful {careful!r}"
    return None


def payloads(
    rng: random.Random,
    corpus: list[tuple[bytes, bool]],
    pool: list[tuple[bytes, bool, PgOutputMessage]],
    wire: WireTarget,
    copy: CopyTarget,
) -> Iterator[tuple[str, bytes, bool, PgOutputMessage | None]]:
    """(source, payload, in_stream, expected message or None), forever. Source `wire`: an
    Insert for the TupleData fast path, its header intact, its tuple maybe mutated; `copy`: a
    COPY text row for the snapshot's twin, maybe mutated."""
    mutate = Mutator(rng, [p for p, _ in corpus] + [p for p, _, _ in pool[:500]])
    tuple_mutate = Mutator(rng, [])  # no splices or tag swaps: they only hit the header
    while True:
        roll = rng.random()
        if roll < 0.2:
            payload = wire.payload()
            if rng.random() < 0.8:
                body = bytearray(tuple_mutate(payload[6:]))
                payload = payload[:6] + bytes(body)
            yield "wire", payload, False, None
            continue
        if roll < 0.3:
            line = copy.row()
            if rng.random() < 0.7:
                line = tuple_mutate(line)
            yield "copy", line, False, None
            continue
        roll = (roll - 0.3) / 0.7
        if roll < 0.45:
            payload, in_stream = rng.choice(corpus)
            if rng.random() < 0.05:
                in_stream = not in_stream  # the same bytes, in the other stream state
            yield "corpus_mutated", mutate(payload), in_stream, None
        elif roll < 0.55:
            payload, in_stream, message = rng.choice(pool)
            yield "generated", payload, in_stream, message
        elif roll < 0.9:
            payload, in_stream, _ = rng.choice(pool)
            yield "generated_mutated", mutate(payload), in_stream, None
        else:
            body = rng.randbytes(rng.randrange(0, 48))
            yield "random_body", bytes([rng.choice(TAGS)]) + body, rng.random() < 0.3, None


def run(
    messages: int,
    seed: int,
    *,
    pool_size: int = 2000,
    slow_s: float = 1.0,
    watchdog_s: float = 120.0,
    on_finding: Callable[[str, bytes, bool, str], None] | None = None,
    progress: Callable[[Stats], None] | None = None,
) -> Stats:
    rng = random.Random(seed)
    corpus = load_corpus()
    pool = structured_pool(pool_size, seed)
    stats = Stats()
    clock = time.perf_counter
    started = clock()
    wire = WireTarget(rng)
    copy = CopyTarget(wire)
    source = payloads(rng, corpus, pool, wire, copy)
    chunk = 10_000
    try:
        while stats.messages < messages:
            # A hang (an endless loop in a parser) ends the run with every thread's traceback.
            faulthandler.dump_traceback_later(watchdog_s, exit=True)
            for _ in range(min(chunk, messages - stats.messages)):
                kind, payload, in_stream, expected = next(source)
                stats.sources[kind] += 1
                t0 = clock()
                if kind == "wire":
                    finding = check_wire(wire, payload, stats)
                elif kind == "copy":
                    finding = check_copy(copy, payload, stats)
                else:
                    finding = check(payload, in_stream, stats, expected)
                took = clock() - t0
                stats.messages += 1
                stats.max_ms = max(stats.max_ms, took * 1000)
                if finding is None and took > slow_s:
                    finding = f"took {took:.2f} s"
                if finding is not None:
                    stats.findings += 1
                    if on_finding is not None:
                        on_finding(kind, payload, in_stream, finding)
            stats.seconds = clock() - started
            if progress is not None:
                progress(stats)
    finally:
        faulthandler.cancel_dump_traceback_later()
    stats.seconds = clock() - started
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.pgoutput_fuzz", description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pool-size", type=int, default=2000, help="generated messages drawn")
    parser.add_argument("--slow-s", type=float, default=1.0, help="one payload slower: a finding")
    parser.add_argument("--findings", type=Path, default=Path("fuzz-findings.txt"))
    args = parser.parse_args(argv)
    found: list[str] = []
    last = [time.monotonic()]

    def on_finding(kind: str, payload: bytes, in_stream: bool, what: str) -> None:
        found.append(f"{int(in_stream)} {payload.hex()}  # {kind}: {what}")
        if len(found) <= 5:
            print(f"finding ({kind}, in_stream={in_stream}): {what}: {payload.hex()}", flush=True)

    def progress(stats: Stats) -> None:
        now = time.monotonic()
        if now - last[0] < 10 and stats.messages < args.messages:
            return
        last[0] = now
        rate = stats.messages / stats.seconds if stats.seconds else 0.0
        eta = (args.messages - stats.messages) / rate if rate else 0.0
        print(
            f"{stats.messages:,}/{args.messages:,} payloads, {rate:,.0f}/s, ETA {eta:.0f} s, "
            f"{stats.findings} findings",
            file=sys.stderr,
            flush=True,
        )

    stats = run(
        args.messages,
        args.seed,
        pool_size=args.pool_size,
        slow_s=args.slow_s,
        on_finding=on_finding,
        progress=progress,
    )
    if found:
        args.findings.write_text("\n".join(found) + "\n")
    print(json.dumps({"seed": args.seed, **stats.summary()}))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
