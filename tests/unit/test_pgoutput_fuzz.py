"""Fuzzing: any input either decodes or raises DecodeError (never another exception, never hangs).

Also checks that the fast path (Begin/Commit/Insert/Update/Delete) accepts and rejects exactly
what the careful, field-by-field parsers do, with the same error.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer.pgoutput import (
    Begin,
    DecodeError,
    Decoder,
    Insert,
    PgOutputMessage,
    StreamStart,
    Value,
)
from producer.pgoutput.fastpath import FAST_PARSERS
from producer.pgoutput.parsers import PARSERS, run_careful
from schemas.errors import ConversionError
from tests.fuzz.pgoutput_fuzz import (
    CopyTarget,
    Stats,
    WireTarget,
    check,
    check_copy,
    check_wire,
    load_corpus,
)
from tests.fuzz.pgoutput_fuzz import run as fuzz_run
from tests.support.pgoutput_encoder import encode
from tests.support.pgoutput_strategies import streamable, unstreamed

pytestmark = pytest.mark.unit

TAGS = sorted(PARSERS)
FUZZ = settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])


def decode_or_error(decoder: Decoder, payload: bytes) -> PgOutputMessage | DecodeError:
    try:
        return decoder.decode(payload)
    except DecodeError as error:
        return error


def in_stream_decoder() -> Decoder:
    decoder = Decoder()
    decoder.decode(encode(StreamStart(77, True)))
    return decoder


@FUZZ
@given(st.binary(max_size=64), st.booleans())
def test_arbitrary_bytes_decode_or_raise_decode_error(payload: bytes, in_stream: bool) -> None:
    decoder = in_stream_decoder() if in_stream else Decoder()
    decode_or_error(decoder, payload)


@FUZZ
@given(st.sampled_from(TAGS), st.binary(max_size=80), st.booleans())
def test_known_tag_with_arbitrary_body_decodes_or_raises(
    tag: int, body: bytes, in_stream: bool
) -> None:
    decoder = in_stream_decoder() if in_stream else Decoder()
    decode_or_error(decoder, bytes([tag]) + body)


@st.composite
def mutated(draw: Any) -> tuple[bytes, bool]:
    """A valid encoding, then truncated, extended, or with bytes overwritten/inserted/deleted."""
    in_stream = draw(st.booleans())
    message = draw(
        streamable(st.integers(0, 2**32 - 1))
        if in_stream
        else st.one_of(unstreamed, streamable(st.none()))
    )
    data = bytearray(encode(message, in_stream=in_stream))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["truncate", "append", "overwrite", "insert", "delete"]))
        at = draw(st.integers(0, len(data)))
        if action == "truncate":
            del data[at:]
        elif action == "append":
            data += draw(st.binary(min_size=1, max_size=8))
        elif action == "overwrite" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif action == "delete" and at < len(data):
            del data[at : at + draw(st.integers(1, 4))]
    return bytes(data), in_stream


@FUZZ
@given(mutated())
def test_mutated_valid_messages_decode_or_raise_decode_error(case: tuple[bytes, bool]) -> None:
    payload, in_stream = case
    decoder = in_stream_decoder() if in_stream else Decoder()
    result = decode_or_error(decoder, payload)
    if isinstance(result, DecodeError):
        assert result.message_type and 0 <= result.offset <= len(payload)


def outcome(parse: Any, payload: bytes, in_stream: bool) -> object:
    try:
        return parse(payload, in_stream)
    except DecodeError as error:
        return ("error", error.message_type, error.offset, error.kind)


@FUZZ
@given(
    st.one_of(
        mutated(),
        st.tuples(
            st.sampled_from(sorted(FAST_PARSERS)).flatmap(
                lambda tag: st.binary(max_size=60).map(lambda body: bytes([tag]) + body)
            ),
            st.booleans(),
        ),
    )
)
def test_fast_path_agrees_with_careful_parsers(case: tuple[bytes, bool]) -> None:
    payload, in_stream = case
    if not payload or payload[0] not in FAST_PARSERS:
        return
    tag = payload[0]
    fast = outcome(FAST_PARSERS[tag], payload, in_stream)
    careful = outcome(lambda p, s: run_careful(tag, p, s), payload, in_stream)
    assert fast == careful


def test_huge_counts_fail_fast_instead_of_allocating_or_looping() -> None:
    # 2^31-1 relations, 65535 columns, a 2 GB message body: all announced, none present.
    for payload in (
        bytes.fromhex("54 7fffffff 00"),
        bytes.fromhex("49 00000001 4e ffff 6e"),
        bytes.fromhex("4d 00 0000000000000000 00 7fffffff"),
        bytes.fromhex("52 00000001 00 00 64 7fff"),
    ):
        with pytest.raises(DecodeError):
            Decoder().decode(payload)


# The fuzzer of tests/fuzz/ (the 1M-payload run is a command in docs/development.md): a small run here.


def test_real_captures_decode_and_both_paths_agree_on_them() -> None:
    corpus = load_corpus()  # raises on any capture the decoder refuses
    tags = {payload[0] for payload, _ in corpus}
    assert {ord(c) for c in "BCORYIUDTMSEcAbPKrp"} <= tags  # every kind PostgreSQL 15 sends
    stats = Stats()
    for payload, in_stream in corpus:
        assert check(payload, in_stream, stats) is None
    assert stats.decoded == len(corpus) and stats.fast_compared > len(corpus) // 2


def test_a_small_fuzz_run_finds_nothing() -> None:
    findings: list[str] = []
    stats = fuzz_run(20_000, seed=20, pool_size=200, on_finding=lambda *f: findings.append(repr(f)))
    assert findings == [] and stats.findings == 0
    assert stats.messages == 20_000
    assert stats.round_trips > 1000 and stats.fast_compared > 5000
    assert stats.wire_accepted > 500  # the TupleData fast path compared on whole tuples
    assert stats.copy_accepted > 300  # the COPY text twin compared on whole rows
    assert len(stats.errors) >= 6  # the mutations reach most error kinds


def test_the_fuzz_check_reports_what_it_hunts(monkeypatch: pytest.MonkeyPatch) -> None:
    begin = encode(Begin(1, 2, 3))
    assert check(begin, False, Stats()) is None
    # A fast parser that decodes differently from the careful one.
    monkeypatch.setitem(FAST_PARSERS, ord("B"), lambda p, s: Begin(9, 9, 9))
    assert "fast path" in (check(begin, False, Stats()) or "")
    # An exception other than DecodeError.
    monkeypatch.setitem(FAST_PARSERS, ord("B"), lambda p, s: 1 // 0)
    assert "ZeroDivisionError" in (check(begin, False, Stats()) or "")
    # A message that does not decode back to what was encoded.
    monkeypatch.undo()
    assert "round trip" in (check(begin, False, Stats(), Begin(1, 2, 4)) or "")


def test_a_numeric_nan_spelt_unlike_postgresql_is_a_conversion_error() -> None:
    """Found by the fuzzer's TupleData target: `nan` (PostgreSQL writes `NaN`) in a
    numeric(12,2) column raised a bare AssertionError from both paths."""
    target = WireTarget(random.Random(0))
    column = next(i for i, c in enumerate(target.codec.columns) if c.pg_type == "numeric(12,2)")
    values: list[Any] = [target.key, *target.text]
    for spelling in (b"nan", b"sNaN", b"inf", b"-infinity"):
        values[column] = Value(spelling, False)
        payload = encode(Insert(None, 1, tuple(values)))
        assert target.wire(payload, 6) is None  # the fast path gives up
        with pytest.raises(ConversionError, match=r"not a finite number"):
            target.codec.encode_row_key(tuple(values))
        assert check_wire(target, payload, Stats()) is None


def test_the_tuple_fast_path_check_reports_disagreement() -> None:
    target = WireTarget(random.Random(0))
    payload = target.payload()
    assert check_wire(target, payload, Stats()) is None
    real = target.wire
    target.wire = lambda buf, pos: (b"x", [], None, len(buf))  # type: ignore[assignment]
    assert "!= careful" in (check_wire(target, payload, Stats()) or "")
    target.wire = lambda buf, pos: 1 // 0  # type: ignore[assignment,return-value]
    assert "raised ZeroDivisionError" in (check_wire(target, payload, Stats()) or "")
    target.wire = real


def test_the_copy_twin_check_reports_disagreement() -> None:
    target = CopyTarget(WireTarget(random.Random(0)))
    line = target.row()
    assert check_copy(target, line, Stats()) is None
    real = target.twin
    target.twin = lambda line: (b"x", None)
    assert "!= careful" in (check_copy(target, line, Stats()) or "")
    target.twin = lambda line: 1 // 0  # type: ignore[assignment,return-value]
    assert "raised ZeroDivisionError" in (check_copy(target, line, Stats()) or "")
    target.twin = lambda line: (b"x", None)
    assert "careful path refuses" in (check_copy(target, b"1\t2", Stats()) or "")
    target.twin = real
