"""Fuzzing: any input either decodes or raises DecodeError (never another exception, never hangs).

Also checks that the fast path (Begin/Commit/Insert/Update/Delete) accepts and rejects exactly
what the careful, field-by-field parsers do, with the same error.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producer.pgoutput import DecodeError, Decoder, PgOutputMessage, StreamStart
from producer.pgoutput.fastpath import FAST_PARSERS
from producer.pgoutput.parsers import PARSERS, run_careful
from tests.support.pgoutput_encoder import encode
from tests.unit.test_pgoutput_roundtrip import streamable, unstreamed

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
