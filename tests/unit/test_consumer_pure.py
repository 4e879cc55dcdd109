"""Pure parts of the consumer: config, topics, framing, envelope, reassembly age, progress, verify."""

from __future__ import annotations

import struct

import pytest

from schemas.topics import TopicKind, classify, subscribe_pattern, subscribed
from schemas.wire import FramingError, split_frame
from spark_consumer import progress, verify
from spark_consumer.columns import key_fields, row_fields
from spark_consumer.config import Decoder, parse_run, parse_verify
from spark_consumer.errors import ConfigError, TransactionError
from spark_consumer.reassembly import TxSummary, check_age
from tests.support.event_writer import ColumnSpec, TableSpec

pytestmark = pytest.mark.unit

ENV = {
    "WALBRIDGE_KAFKA_BOOTSTRAP": "k:9092",
    "WALBRIDGE_SCHEMA_REGISTRY_URL": "http://r",
    "WALBRIDGE_TOPIC_PREFIX": "db",
    "WALBRIDGE_LAKE_PATH": "/lake/",
}


def test_run_config_from_env_with_defaults() -> None:
    cfg = parse_run([], ENV)
    assert (cfg.kafka_bootstrap, cfg.topic_prefix, cfg.lake_path) == ("k:9092", "db", "/lake")
    assert cfg.checkpoint_path == "/lake/_walbridge/checkpoint"
    assert cfg.trigger == "1 second" and not cfg.available_now
    assert cfg.progress_path == "/lake/_walbridge/progress"
    assert cfg.table_path("public", "t") == "/lake/public/t"
    assert cfg.decoder is Decoder.FROM_AVRO


def test_flags_alone() -> None:
    env = {k: v for k, v in ENV.items() if k != "WALBRIDGE_TOPIC_PREFIX"}
    cfg = parse_run(["--topic-prefix", "other", "--trigger", "500 ms"], env)
    assert cfg.topic_prefix == "other" and cfg.trigger == "500 ms"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, "missing required"),
        (["--available-now"], {**ENV, "WALBRIDGE_TRIGGER": "5 seconds"}, "conflicts"),
        (["--trigger", "soon"], ENV, "not an interval"),
        (
            [],
            {**ENV, "WALBRIDGE_AVAILABLE_NOW": "maybe"},
            "WALBRIDGE_AVAILABLE_NOW: expected true/false",
        ),
        (["--max-pending-records", "0"], ENV, "must be positive"),
        (["--quarantine-path", "/lake/_walbridge/checkpoint/q"], ENV, "quarantine"),
    ],
)
def test_bad_config_fails_fast(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_run(argv, env)


def test_unknown_flag_is_an_error() -> None:
    with pytest.raises(ConfigError, match="invalid command line"):
        parse_run(["--no-such-flag"], ENV)


def test_verify_config_tables() -> None:
    cfg = parse_verify(
        [],
        {
            "WALBRIDGE_PG_DSN": "dbname=x",
            "WALBRIDGE_LAKE_PATH": "/l",
            "WALBRIDGE_PUBLICATION": "p",
            "WALBRIDGE_TABLES": 'public.a, s.b, "My Schema"."a.b"',
        },
    )
    assert cfg.tables == (("public", "a"), ("s", "b"), ("My Schema", "a.b"))
    with pytest.raises(ConfigError, match=r"schema\.table"):
        parse_verify(
            ["--tables", "a"],
            {"WALBRIDGE_PG_DSN": "x", "WALBRIDGE_LAKE_PATH": "/l", "WALBRIDGE_PUBLICATION": "p"},
        )


def test_topics() -> None:
    import re

    pattern = subscribe_pattern("my-db.x")
    # Java's \Q..\E quoting, translated for Python's re to check the intent.
    py = re.escape("my-db.x") + pattern.split(r"\E", 1)[1]
    assert re.fullmatch(py, "my-db.x.public.orders")
    assert re.fullmatch(py, "my-db.x.transaction")
    assert not re.fullmatch(py, "my-db.x.heartbeat")
    assert not re.fullmatch(py, "my-db.x.message")
    assert re.fullmatch(py, "my-db.x.snapshot")  # followed: which tables are being snapshotted
    assert classify("db", "db.snapshot") is TopicKind.SNAPSHOT
    assert not re.fullmatch(py, "my-dbXx.public.orders")
    assert classify("db", "db.transaction") is TopicKind.TRANSACTION
    assert classify("db", "db.public.t") is TopicKind.DATA
    with pytest.raises(ValueError, match="not under prefix"):
        classify("db", "other.public.t")


def test_subscribed_says_what_the_subscribe_pattern_matches() -> None:
    import re

    py = re.escape("my-db.x") + subscribe_pattern("my-db.x").split(r"\E", 1)[1]
    names = ["public.orders", "transaction", "heartbeat", "message", "offsets", "snapshot", ""]
    names += ["heartbeat.x", "a.offsets", "x.message"]
    for topic in [*(f"my-db.x.{n}" for n in names), "my-dbXx.public.orders", "other.t", "my-db.x"]:
        assert subscribed("my-db.x", topic) == bool(re.fullmatch(py, topic)), topic


def test_split_frame() -> None:
    schema_id, body = split_frame(b"\x00" + struct.pack(">I", 258) + b"abc")
    assert schema_id == 258 and bytes(body) == b"abc"
    with pytest.raises(FramingError, match="magic byte 1"):
        split_frame(b"\x01\x00\x00\x00\x01x")
    with pytest.raises(FramingError, match="shorter"):
        split_frame(b"\x00\x00")


def test_envelope_fields_from_contract_schema() -> None:
    spec = TableSpec(
        "public",
        "t",
        (ColumnSpec("id", "long", "int8"), ColumnSpec("v", "string", "text")),
        ("id",),
    )
    fields = row_fields(spec.value_schema("db"))
    assert [(f.name, f.pg_type) for f in fields] == [("id", "int8"), ("v", "text")]
    assert key_fields(spec.key_schema("db")) == ("id",)
    clash = TableSpec("public", "t", (ColumnSpec("_op", "string", "text"),), ())
    with pytest.raises(ValueError, match="clash"):
        row_fields(clash.value_schema("db"))


def test_stale_transaction_is_named() -> None:
    tx = TxSummary("7:100", 100, True, ("public.a: 1 of 2 events",), first_seen_ms=0)
    check_age([tx], now_ms=60_000, max_age_s=61)  # young enough: no error
    with pytest.raises(TransactionError, match=r"tx 7:100 .*public.a: 1 of 2 events"):
        check_age([tx], now_ms=62_000, max_age_s=61)


def test_merge_offsets_keeps_the_next_offset() -> None:
    out = progress.merge_offsets({"a": {"0": 5}}, [("a", 0, 9), ("a", 1, 0), ("b", 0, 3)])
    assert out == {"a": {"0": 10, "1": 1}, "b": {"0": 4}}
    assert progress.merge_offsets(out, [("a", 0, 2)])["a"]["0"] == 10


def test_unread_names_partitions_past_what_the_lake_read() -> None:
    read = {"a": {"0": 10, "1": 4}}
    assert progress.unread(read, [("a", 0, 9), ("a", 1, 3)]) == []  # a replay: all read
    assert progress.unread(read, [("b", 0, 0), ("a", 1, 4), ("a", 0, 2)]) == [
        ("a", 1, 4, 4),  # the next offset itself was never read
        ("b", 0, 0, 0),  # a partition the lake never read from
    ]


def test_verify_diff() -> None:
    pg = {(1,): {"id": "1", "v": "1.50"}, (2,): {"id": "2", "v": None}}
    lake = {(1,): {"id": "1", "v": "1.50"}, (3,): {"id": "3", "v": None}}
    d = verify.diff("public.t", pg, lake)
    assert d.missing == ((2,),) and d.extra == ((3,),) and d.different == ()
    assert not d.equal
    d2 = verify.diff("public.t", pg, {**lake, (2,): {"id": "2", "v": "x"}})
    assert d2.different == (((2,), "v", None, "x"),)
    assert verify.report([d]).splitlines()[:2] == [
        "public.t: 1 missing, 1 extra, 0 different (first 20 of each)",
        "  missing (2,)",
    ]
    assert verify.diff("t", pg, dict(pg)).equal


@pytest.mark.parametrize("name", ["id", "price__text", "_from_id", "Col_9"])
def test_merge_accepts_plain_avro_names(name: str) -> None:
    from spark_consumer.merge import check_names

    check_names("public.t", [name])


@pytest.mark.parametrize("name", ["we`ird", "a b", "x' OR 1=1 --", "9lives", "", "col.name", "é"])
def test_merge_refuses_a_name_that_could_leave_its_quotes(name: str) -> None:
    from spark_consumer.errors import ApplyError
    from spark_consumer.merge import check_names

    with pytest.raises(ApplyError) as err:
        check_names("public.t", ["id", name])
    assert "public.t" in str(err.value) and repr(name) in str(err.value)


def test_checkpoint_due_every_ten_versions_past_the_last() -> None:
    from spark_consumer.checkpoints import due

    assert not due(9, -1)
    assert due(10, -1)
    assert not due(19, 10)
    assert due(20, 10)
    assert due(25, 10)
    assert not due(11, 11)
    assert due(12, 2, every=10)
    assert due(3, -1, every=3)


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("/var/lib/walbridge/lake", True),
        ("lake", True),
        ("file:///tmp/cp", True),
        ("FILE:/tmp/cp", True),
        ("s3a://bucket/lake", False),
        ("abfss://c@a.dfs.core.windows.net/lake", False),
    ],
)
def test_local_paths_take_the_file_system_checkpoint_manager(path: str, local: bool) -> None:
    from spark_consumer.source import local_path

    assert local_path(path) is local
