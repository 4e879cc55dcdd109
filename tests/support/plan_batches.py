"""Random batches of planner input (hypothesis): transactions complete, short of events, BEGIN
only or with no markers at all, replays below the watermark, producer replays, truncates, TOAST
columns and key bounds of either kind. Shared by the planner's reference test and the test that
plans the same batches in Spark."""

from __future__ import annotations

from hypothesis import strategies as st

from spark_consumer.reassembly import MarkerStats, TableStats

TABLES = ("s.a", "s.b", "s.c")


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[TableStats], list[MarkerStats], int]:
    data: list[TableStats] = []
    markers: list[MarkerStats] = []
    n = draw(st.integers(0, 8))
    string_keys = draw(st.booleans())
    for i in range(1, n + 1):
        tx, lsn = f"{i}:{i * 10}", i * 10
        tables = draw(st.lists(st.sampled_from(TABLES), unique=True, max_size=3))
        expected: dict[str, int] = {}
        for c in tables:
            # 0: events without a total_order (collect_set skips nulls), so none counts.
            events = draw(st.sampled_from((0, 1, 1, 2, 3)))
            records = max(1, events + draw(st.sampled_from((0, 0, 1))))  # 1: a producer replay
            truncates = draw(st.integers(0, records))
            low = draw(st.one_of(st.none(), st.integers(-5, 5)))
            low = str(low) if string_keys and low is not None and i % 3 else low
            data.append(
                TableStats(
                    tx,
                    c,
                    f"db.{c}",
                    lsn,
                    events,
                    records,
                    draw(st.integers(0, 3)),
                    truncate_order=draw(st.integers(0, 3)) if truncates else None,
                    truncates=truncates,
                    toast_columns=frozenset(draw(st.lists(st.sampled_from("xyz"), max_size=2))),
                    key_min=low,
                    key_max=low,
                    only_inserts=draw(st.booleans()),
                )
            )
            # The END usually counts what arrived; sometimes more (events still missing).
            expected[c] = events + draw(st.sampled_from((0, 0, 0, 1)))
        if draw(st.booleans()):
            expected[draw(st.sampled_from(TABLES))] = draw(st.integers(0, 2))  # one never sent
        kind = draw(st.sampled_from(("end", "end", "end", "begin", "none")))
        if kind != "none":
            markers.append(
                MarkerStats(
                    tx,
                    lsn,
                    kind == "end",
                    expected if kind == "end" else {},
                    2 if kind == "end" else 1,
                    draw(st.integers(0, 3)),
                    draw(st.one_of(st.none(), st.integers(0, 10**12))),
                )
            )
    watermark = draw(st.sampled_from((-1, 0, 10, 25)))
    return data, markers, watermark
