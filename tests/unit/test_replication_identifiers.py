"""Quoting and validation of names sent to the walsender (no services)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producer.replication import ErrorKind, ReplicationError, TableName
from producer.replication.identifiers import (
    quote_identifier,
    quote_literal,
    validate_identifier,
    validate_slot_name,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("pub", '"pub"'),
        ('my"pub', '"my""pub"'),
        ('"; DROP TABLE x; --', '"""; DROP TABLE x; --"'),
        ("Ünïcode pub", '"Ünïcode pub"'),
    ],
)
def test_quote_identifier_doubles_quotes(name: str, quoted: str) -> None:
    assert quote_identifier(name) == quoted


@pytest.mark.parametrize(
    ("value", "quoted"),
    [("1", "'1'"), ("it's", "'it''s'"), ("a\\b", "'a\\b'"), ("''", "''''''")],
)
def test_quote_literal_doubles_single_quotes_only(value: str, quoted: str) -> None:
    assert quote_literal(value) == quoted


def _unquote_identifier(text: str) -> str:
    """The walsender scanner's rule for "..." identifiers, as an oracle."""
    assert text[0] == text[-1] == '"'
    inner = text[1:-1]
    assert '"' not in inner.replace('""', "")
    return inner.replace('""', '"')


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=20))
def test_quote_identifier_round_trips(name: str) -> None:
    assert _unquote_identifier(quote_identifier(name)) == name


@pytest.mark.parametrize(
    "name", ["", "a" * 64, "é" * 32, "bad\x00name", "line\nbreak", "tab\tname", "del\x7f"]
)
def test_hostile_identifiers_are_refused(name: str) -> None:
    with pytest.raises(ReplicationError) as info:
        validate_identifier(name, "publication name")
    assert info.value.kind is ErrorKind.IDENTIFIER
    assert "publication name" in str(info.value)


def test_sixty_three_bytes_is_the_limit() -> None:
    assert validate_identifier("a" * 63) == "a" * 63


@pytest.mark.parametrize("name", ["", "Upper", "with-dash", "sp ace", 'q"uote', "a" * 64, "é"])
def test_invalid_slot_names_are_refused(name: str) -> None:
    with pytest.raises(ReplicationError) as info:
        validate_slot_name(name)
    assert info.value.kind is ErrorKind.IDENTIFIER


def test_valid_slot_name() -> None:
    assert validate_slot_name("walbridge_slot_1") == "walbridge_slot_1"


def test_literal_with_nul_is_refused() -> None:
    with pytest.raises(ReplicationError, match="NUL"):
        quote_literal("a\x00b")


def test_table_name_parse() -> None:
    assert TableName.parse(" public.orders ") == TableName("public", "orders")
    assert str(TableName("Sales", "Order Lines")) == "Sales.Order Lines"


@pytest.mark.parametrize("text", ["orders", "a.b.c", ".orders", "public.", "public.bad\x01"])
def test_table_name_parse_refuses(text: str) -> None:
    with pytest.raises(ReplicationError) as info:
        TableName.parse(text)
    assert info.value.kind is ErrorKind.IDENTIFIER
