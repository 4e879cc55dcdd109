"""Hypothesis round trip: test encoder -> Decoder gives back the same message, in and out of streams."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.pgoutput import Decoder, PgOutputMessage, StreamStart, StreamStop
from tests.support.pgoutput_encoder import encode
from tests.support.pgoutput_strategies import streamable, u32, unstreamed

pytestmark = pytest.mark.unit


@given(st.one_of(unstreamed, streamable(st.none())))
def test_round_trip_outside_a_stream(message: PgOutputMessage) -> None:
    decoded = Decoder().decode(encode(message))
    assert decoded == message
    assert type(decoded) is type(message)


@given(u32, st.booleans(), st.lists(streamable(u32), min_size=1, max_size=5))
def test_round_trip_inside_a_stream(
    stream_xid: int, first: bool, messages: list[PgOutputMessage]
) -> None:
    decoder = Decoder()
    assert decoder.decode(encode(StreamStart(stream_xid, first))) == StreamStart(stream_xid, first)
    for message in messages:
        assert decoder.decode(encode(message, in_stream=True)) == message
    assert decoder.decode(encode(StreamStop())) == StreamStop()
    assert decoder.stream_xid is None


@given(st.lists(st.one_of(unstreamed, streamable(st.none())), max_size=8))
def test_a_sequence_through_one_decoder_equals_one_decoder_per_message(
    messages: list[PgOutputMessage],
) -> None:
    decoder = Decoder()
    assert [decoder.decode(encode(m)) for m in messages] == messages
