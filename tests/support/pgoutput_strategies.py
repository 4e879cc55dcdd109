"""Hypothesis strategies for pgoutput messages (structure-aware generation): the round-trip
tests and the fuzzer (tests/fuzz/) draw from them."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from producer.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
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
    Truncate,
    Type,
    Update,
    Value,
)

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
