"""The column rule shared by the snapshot and `verify` (schemas.published_columns), case by case
against what pgoutput does on each major (the integration test checks the same cases against the
Relation messages of a real server)."""

from __future__ import annotations

import pytest

from schemas.published_columns import (
    Attribute,
    PublicationColumns,
    PublishedColumnsError,
    select,
)

pytestmark = pytest.mark.unit

# id, a, s (stored generated), b, and on 18 v (virtual generated); attnum 4 was dropped.
ID, A, S, B, V = (
    Attribute(1, "id", ""),
    Attribute(2, "a", ""),
    Attribute(3, "s", "s"),
    Attribute(5, "b", ""),
    Attribute(6, "v", "v"),
)
BEFORE_18 = (ID, A, S, B)
ON_18 = (ID, A, S, B, V)


def pub(
    major: int, column_list: set[int] | None = None, stored: bool = False
) -> PublicationColumns:
    return PublicationColumns(
        "p", major, None if column_list is None else frozenset(column_list), stored
    )


def names(major: int, attributes: tuple[Attribute, ...], p: PublicationColumns) -> list[str]:
    return list(select("public.t", attributes, p).names)


@pytest.mark.parametrize("major", [15, 16, 17])
def test_before_18_generated_columns_are_never_published(major: int) -> None:
    chosen = select("public.t", BEFORE_18, pub(major))
    assert chosen.names == ("id", "a", "b")
    assert chosen.skipped_text() == (
        f"s (stored generated: PostgreSQL {major} does not publish generated columns (18+ can))",
    )
    # A column list cannot name a generated column before 18; the rule still never sends one.
    assert names(major, BEFORE_18, pub(major, {1, 3, 5})) == ["id", "b"]


@pytest.mark.parametrize("major", [15, 16, 17])
def test_before_18_a_column_list_is_honoured(major: int) -> None:
    chosen = select("public.t", BEFORE_18, pub(major, {1, 5}))
    assert chosen.names == ("id", "b")
    assert chosen.skipped_text() == (
        "a (not in the column list of publication 'p')",
        f"s (stored generated: PostgreSQL {major} does not publish generated columns (18+ can))",
    )


def test_18_without_publish_generated_columns_sends_ordinary_columns_only() -> None:
    chosen = select("public.t", ON_18, pub(18))
    assert chosen.names == ("id", "a", "b")
    assert chosen.skipped_text() == (
        "s (stored generated: publication 'p' has publish_generated_columns = none)",
        "v (virtual generated: never published)",
    )


def test_18_publish_generated_columns_stored_sends_stored_ones_in_their_place() -> None:
    chosen = select("public.t", ON_18, pub(18, stored=True))
    assert chosen.names == ("id", "a", "s", "b")
    assert chosen.skipped_text() == ("v (virtual generated: never published)",)


def test_18_a_column_list_decides_whatever_publish_generated_columns_says() -> None:
    # Listed stored generated column, publication default (none): sent.
    assert names(18, ON_18, pub(18, {1, 3})) == ["id", "s"]
    # Stored generated column left out of the list of a `stored` publication: not sent.
    chosen = select("public.t", ON_18, pub(18, {1, 5}, stored=True))
    assert chosen.names == ("id", "b")
    assert "s (not in the column list of publication 'p')" in chosen.skipped_text()


def test_a_virtual_column_is_never_published_even_if_listed() -> None:
    # PostgreSQL refuses to list one; were a catalog to say so anyway, the WAL has no value.
    assert names(18, ON_18, pub(18, {1, 6}, stored=True)) == ["id"]


def test_the_order_is_attnum_order_whatever_the_input_order() -> None:
    assert names(18, (V, B, S, A, ID), pub(18, stored=True)) == ["id", "a", "s", "b"]


def test_an_unknown_kind_of_generated_column_stops_with_table_and_column() -> None:
    with pytest.raises(PublishedColumnsError, match=r"public\.t\.w: unknown .*attgenerated 'x'"):
        select("public.t", (ID, Attribute(7, "w", "x")), pub(18))
