"""Hypothesis round trip: test encoder -> Decoder gives back the same message, in and out of streams."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Decoder,
    Delete,
    Insert,
    Message,
    Origin,
    PgOutputMessage,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
    Value,
)
from tests.support.pgoutput_encoder import encode

pytestmark = pytest.mark.unit

u8 = st.integers(0, 0xFF)
u32 = st.integers(0, 0xFFFFFFFF)
i32 = st.integers(-(2**31), 2**31 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
# Names: any UTF-8 text without NUL (surrogates can't be encoded).
names = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=20)

column_values = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.builds(Value, st.binary(max_size=40), st.booleans()),
)
tuples = st.lists(column_values, max_size=12).map(tuple)


@st.composite
def columns(draw: Any) -> Column:
    flags = draw(st.integers(0, 1))
    return Column(flags, draw(names), draw(u32), draw(i32), is_key=flags == 1)


def streamable(xids: st.SearchStrategy[int | None]) -> st.SearchStrategy[PgOutputMessage]:
    """Messages that carry an xid inside a stream (``xids``: None outside, ints inside)."""
    return st.one_of(
        st.builds(
            Relation,
            xids,
            u32,
            names,
            names,
            st.sampled_from(["d", "n", "f", "i"]),
            st.lists(columns(), max_size=6).map(tuple),
        ),
        st.builds(Type, xids, u32, names, names),
        st.builds(Insert, xids, u32, tuples),
        st.builds(Update, xids, u32, st.just(None), st.just(None), tuples),
        st.builds(Update, xids, u32, st.sampled_from(["K", "O"]), tuples, tuples),
        st.builds(Delete, xids, u32, st.sampled_from(["K", "O"]), tuples),
        st.builds(
            Truncate, xids, st.lists(u32, max_size=5).map(tuple), st.booleans(), st.booleans()
        ),
        st.builds(Message, xids, st.booleans(), u64, names, st.binary(max_size=40)),
    )


unstreamed = st.one_of(
    st.builds(Begin, u64, i64, u32),
    st.builds(Commit, u8, u64, u64, i64),
    st.builds(Origin, u64, names),
    st.builds(StreamCommit, u32, u8, u64, u64, i64),
    st.builds(StreamAbort, u32, u32),
    st.builds(StreamAbort, u32, u32, u64, i64),
    st.builds(BeginPrepare, u64, u64, i64, u32, names),
    st.builds(Prepare, u8, u64, u64, i64, u32, names),
    st.builds(CommitPrepared, u8, u64, u64, i64, u32, names),
    st.builds(RollbackPrepared, u8, u64, u64, i64, i64, u32, names),
    st.builds(StreamPrepare, u8, u64, u64, i64, u32, names),
)


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
