"""Hostile identifiers: topic parts, lake paths, the WALBRIDGE_TABLES syntax (CONTRACT.md, "Names")."""

from __future__ import annotations

import posixpath
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producer.replication.errors import ReplicationError
from producer.replication.identifiers import TableName
from schemas.safe_names import lake_table_path, name_part
from schemas.table_list import TableListError, format_table, parse_table_list
from schemas.topics import TableTopics, TopicNameError, check_prefix, classify, table_topic

pytestmark = pytest.mark.unit

HOSTILE_SCHEMA = "Hostile Sch_…"
HOSTILE_TABLE = 'Wé"ird`; DROP TABLE x; --'
KAFKA_LEGAL = re.compile(r"[A-Za-z0-9._-]{1,249}")


def test_valid_names_keep_their_topic_and_lake_path() -> None:
    assert table_topic("shop", "public", "orders") == "shop.public.orders"
    assert table_topic("prod.cdc", "Sales", "order-lines_2") == "prod.cdc.Sales.order-lines_2"
    assert lake_table_path("/lake/", "public", "orders") == "/lake/public/orders"


def test_hostile_names_become_readable_unique_parts() -> None:
    schema, table = name_part(HOSTILE_SCHEMA), name_part(HOSTILE_TABLE)
    assert re.fullmatch(r"Hostile_Sch___[0-9a-f]{8}", schema), schema
    assert re.fullmatch(r"We_ird___DROP_TABLE_x__--_[0-9a-f]{8}", table), table
    topic = table_topic("db", HOSTILE_SCHEMA, HOSTILE_TABLE)
    assert KAFKA_LEGAL.fullmatch(topic)
    assert topic == f"db.{schema}.{table}"
    # Deterministic: the same name always gives the same part (the suffix is a digest).
    assert name_part(HOSTILE_TABLE) == table
    # Non-ASCII letters keep their ASCII letters.
    assert name_part("ÜnïCode").startswith("UniCode_")


def test_names_that_read_the_same_after_replacement_still_differ() -> None:
    parts = {name_part(n) for n in ("a.b", "a b", "a/b", "a_b", "a-b", "á.b")}
    assert len(parts) == 6


def test_dots_never_reach_a_topic_part() -> None:
    # `s`.`a.b` and `s.a`.`b` would both be `p.s.a.b` if dots were kept.
    assert table_topic("p", "s", "a.b") != table_topic("p", "s.a", "b")
    topic = table_topic("p", "s", "a.b")
    assert classify("p", topic).value == "data"
    assert topic.count(".") == 2


@pytest.mark.parametrize(
    "schema, table",
    [("..", ".."), ("a/../../etc", "passwd"), ("/", "x"), (".", "t"), ("_walbridge", "progress")],
)
def test_lake_path_stays_two_levels_below_the_lake(schema: str, table: str) -> None:
    path = lake_table_path("/lake", schema, table)
    assert posixpath.normpath(path) == path
    assert posixpath.dirname(posixpath.dirname(path)) == "/lake"
    assert not path.startswith("/lake/_walbridge/")


@settings(max_examples=300)
@given(
    st.text(min_size=1, max_size=63).filter(lambda s: "\x00" not in s),
    st.text(min_size=1, max_size=63).filter(lambda s: "\x00" not in s),
)
def test_any_name_gives_a_legal_topic_and_a_contained_lake_path(schema: str, table: str) -> None:
    topic = table_topic("db", schema, table)
    assert KAFKA_LEGAL.fullmatch(topic), topic
    assert topic.count(".") == 2
    path = lake_table_path("/lake", schema, table)
    assert posixpath.normpath(path) == path
    assert posixpath.dirname(posixpath.dirname(path)) == "/lake"
    # The consumer reads the parts back from the topic; they map to the same lake path.
    _, s_part, t_part = topic.split(".")
    assert lake_table_path("/lake", s_part, t_part) == path


def test_two_tables_sharing_a_topic_are_refused_naming_both() -> None:
    topics = TableTopics("db", [("public", "orders")])
    assert topics.topic("public", "orders") == "db.public.orders"  # the same table again: fine
    digest = name_part("a.b").rsplit("_", 1)[1]
    with pytest.raises(TopicNameError, match=r"'s'\.'a_b_" + digest + r"'.*'s'\.'a\.b'"):
        TableTopics("db", [("s", "a.b"), ("s", f"a_b_{digest}")])


def test_kafka_dot_underscore_collisions_are_refused() -> None:
    # Kafka refuses `db.s_x.t` next to `db.s.x_t` (same metric names): refuse it first, clearly.
    with pytest.raises(TopicNameError, match="same Kafka topic"):
        TableTopics("db", [("s_x", "t"), ("s", "x_t")])


def test_tables_sharing_a_data_collection_name_are_refused() -> None:
    # Different topics, but markers and the progress table would name both "a.b.c".
    assert table_topic("db", "a.b", "c") != table_topic("db", "a", "b.c")
    with pytest.raises(TopicNameError, match=r"share the name 'a\.b\.c'"):
        TableTopics("db", [("a.b", "c"), ("a", "b.c")])


def test_prefix_must_be_a_valid_topic_name() -> None:
    assert check_prefix("prod.cdc-1") == "prod.cdc-1"
    for bad in ("my db", "db/x", "", "..", "é"):
        with pytest.raises(TopicNameError):
            check_prefix(bad)


def test_over_long_topic_is_refused() -> None:
    with pytest.raises(TopicNameError, match="longer than Kafka's 249"):
        table_topic("p" * 200, "s" * 30, "t" * 30)


def test_table_list_reads_quoted_and_unquoted_names() -> None:
    text = ' public.orders, "My Schema"."a.b" ,Sales.Order Lines,x."say ""hi"", now",,'
    assert parse_table_list(text) == (
        ("public", "orders"),
        ("My Schema", "a.b"),
        ("Sales", "Order Lines"),
        ("x", 'say "hi", now'),
    )
    assert parse_table_list("  ") == ()


@pytest.mark.parametrize(
    "text", ["orders", "a.b.c", ".orders", "public.", '"unterminated.x', 'a"b.c', '"".x', "a.b c.d"]
)
def test_table_list_refuses_malformed_entries(text: str) -> None:
    with pytest.raises(TableListError):
        parse_table_list(text)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.text(min_size=1), st.text(min_size=1)), max_size=4))
def test_format_table_round_trips(tables: list[tuple[str, str]]) -> None:
    tables = [(s, t) for s, t in tables if s.strip() and t.strip()]
    text = ", ".join(format_table(s, t) for s, t in tables)
    assert parse_table_list(text) == tuple(tables)


def test_walbridge_tables_accepts_the_issue_names() -> None:
    text = '"Hostile Sch_…"."Wé""ird`; DROP TABLE x; --", public.orders'
    assert TableName.parse_list(text) == (
        TableName(HOSTILE_SCHEMA, HOSTILE_TABLE),
        TableName("public", "orders"),
    )
    assert TableName(HOSTILE_SCHEMA, HOSTILE_TABLE).quoted() == (
        'Hostile Sch_…."Wé""ird`; DROP TABLE x; --"'  # quoted only where needed
    )
    with pytest.raises(ReplicationError, match=r"schema\.table"):
        TableName.parse_list("public.orders, lonely")


def test_lake_column_comments_name_the_postgresql_column_and_are_safe_literals() -> None:
    from urllib.parse import unquote

    from spark_consumer.merge_target import pg_name_comment

    for name in ("sp ace", "Id`x", "it's", "a\\b%", "new`col)", "ÜnïCode", "x\ny"):
        comment = pg_name_comment(name)
        assert "'" not in comment and "\\" not in comment and "\n" not in comment
        assert unquote(comment.removeprefix("PostgreSQL column ")) == name
    assert pg_name_comment("sp ace") == "PostgreSQL column sp ace"
