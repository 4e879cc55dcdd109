"""Consumer configuration fails fast: unknown variables, flag/variable conflicts, no secrets."""

from __future__ import annotations

import pytest

from spark_consumer.config import parse_run, parse_verify
from spark_consumer.errors import ConfigError

pytestmark = pytest.mark.unit

ENV = {
    "WALBRIDGE_KAFKA_BOOTSTRAP": "k:9092",
    "WALBRIDGE_SCHEMA_REGISTRY_URL": "http://r",
    "WALBRIDGE_TOPIC_PREFIX": "db",
    "WALBRIDGE_LAKE_PATH": "/lake",
}
VERIFY = {
    "WALBRIDGE_PG_DSN": "dbname=x password=hunter2",
    "WALBRIDGE_LAKE_PATH": "/l",
    "WALBRIDGE_PUBLICATION": "p",
}


def test_unknown_variable_is_an_error() -> None:
    with pytest.raises(ConfigError, match="WALBRIDGE_TRIGER"):
        parse_run([], {**ENV, "WALBRIDGE_TRIGER": "5 seconds"})
    with pytest.raises(ConfigError, match="WALBRIDGE_LAKEPATH"):
        parse_verify([], {**VERIFY, "WALBRIDGE_LAKEPATH": "/x"})


def test_shared_environment_is_accepted() -> None:
    """One shell runs the stack, the producer and the consumer: their variables are known."""
    shared = {
        "WALBRIDGE_HOME": "/h",
        "WALBRIDGE_PG_PORT": "1",
        "WALBRIDGE_SLOT": "s",
        "WALBRIDGE_PG_DSN": "dbname=x",
        "WALBRIDGE_LINGER_MS": "5",
        "WALBRIDGE_SPARK_MASTER": "local[2]",
        "OTHER": "x",
    }
    assert parse_run([], {**ENV, **shared}).topic_prefix == "db"


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--topic-prefix", "other"],
            ENV,
            r"--topic-prefix and WALBRIDGE_TOPIC_PREFIX disagree \('other' vs 'db'\)",
        ),
        (["--available-now"], {**ENV, "WALBRIDGE_AVAILABLE_NOW": "false"}, "disagree"),
        (["--merge-threads", "2"], {**ENV, "WALBRIDGE_MERGE_THREADS": "3"}, "disagree"),
        ([], {**ENV, "WALBRIDGE_MERGE_THREADS": "three"}, r"WALBRIDGE_MERGE_THREADS: .*'three'"),
        ([], {**ENV, "WALBRIDGE_MAX_PENDING_AGE_S": "nan"}, "must be positive"),
        ([], {**ENV, "WALBRIDGE_DECODER": "java"}, "WALBRIDGE_DECODER: 'java' is not one of"),
    ],
)
def test_conflicts_and_bad_values(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_run(argv, env)


def test_same_value_twice_is_fine() -> None:
    cfg = parse_run(
        ["--topic-prefix", "db", "--merge-threads", "3"], {**ENV, "WALBRIDGE_MERGE_THREADS": "3"}
    )
    assert (cfg.topic_prefix, cfg.merge_threads) == ("db", 3)


def test_dsn_conflict_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as info:
        parse_verify(["--pg-dsn", "dbname=y password=hunter3"], VERIFY)
    assert "disagree; set one" in str(info.value)
    assert "hunter" not in str(info.value)


def test_bad_command_line_is_not_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_verify(["--pg-dsn=dbname=y password=hunter3", "--nope"], {})
    assert "hunter" not in str(info.value)
    assert "hunter" not in capsys.readouterr().err


def test_batches_are_capped_by_default_and_the_cap_can_be_lifted() -> None:
    # The first batch after an outage must not swallow the whole backlog.
    from spark_consumer.config import DEFAULT_MAX_OFFSETS_PER_TRIGGER, DEFAULT_METRICS_PORT

    default = parse_run([], ENV)
    assert default.max_offsets_per_trigger == DEFAULT_MAX_OFFSETS_PER_TRIGGER > 0
    assert default.metrics_port == DEFAULT_METRICS_PORT
    # One huge source transaction spans many capped batches: the pending limit lets 5M
    # rows through with the defaults.
    assert default.max_pending_records > 5_000_000 + 2
    assert parse_run(["--max-offsets-per-trigger", "0"], ENV).max_offsets_per_trigger == 0
    assert (
        parse_run([], {**ENV, "WALBRIDGE_MAX_OFFSETS_PER_TRIGGER": "1000"}).max_offsets_per_trigger
        == 1000
    )
    with pytest.raises(ConfigError, match="max-offsets-per-trigger"):
        parse_run(["--max-offsets-per-trigger", "-1"], ENV)
    assert parse_run([], {**ENV, "WALBRIDGE_CONSUMER_METRICS_PORT": "0"}).metrics_port == 0
    assert default.lake_deletion_vectors is True
    assert parse_run(["--lake-deletion-vectors", "false"], ENV).lake_deletion_vectors is False
    no_dv = {**ENV, "WALBRIDGE_LAKE_DELETION_VECTORS": "false"}
    assert parse_run([], no_dv).lake_deletion_vectors is False
    with pytest.raises(ConfigError, match="disagree"):
        parse_run(["--lake-deletion-vectors", "true"], no_dv)
    # The one boolean parser: on/off as for every other boolean of either tool.
    assert not parse_run(
        [], {**ENV, "WALBRIDGE_LAKE_DELETION_VECTORS": "off"}
    ).lake_deletion_vectors
    with pytest.raises(ConfigError, match="WALBRIDGE_LAKE_DELETION_VECTORS: expected true/false"):
        parse_run([], {**ENV, "WALBRIDGE_LAKE_DELETION_VECTORS": "maybe"})
    with pytest.raises(ConfigError, match="metrics-port"):
        parse_run(["--metrics-port", "70000"], ENV)
    # Deletion vectors always by default (issue 40: a rewrite writes whole files per batch).
    assert default.lake_rewrite_below_bytes == 0
    small = {**ENV, "WALBRIDGE_LAKE_REWRITE_BELOW_BYTES": str(8 * 2**20)}
    assert parse_run([], small).lake_rewrite_below_bytes == 8 * 2**20
    with pytest.raises(ConfigError, match="lake-rewrite-below-bytes"):
        parse_run(["--lake-rewrite-below-bytes", "-1"], ENV)


def test_a_config_built_in_code_is_checked_and_normalised_as_one_read() -> None:
    from spark_consumer.config import DEFAULT_TRIGGER, ConsumerConfig

    cfg = ConsumerConfig(kafka_bootstrap="k", schema_registry_url="r", topic_prefix="p",
                         lake_path="/lake/")  # fmt: skip
    assert (cfg.lake_path, cfg.checkpoint_path) == ("/lake", "/lake/_walbridge/checkpoint")
    assert cfg.trigger == DEFAULT_TRIGGER
    with pytest.raises(ConfigError, match="merge-threads"):
        ConsumerConfig(kafka_bootstrap="k", schema_registry_url="r", topic_prefix="p",
                       lake_path="/l", merge_threads=0)  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["run"], {}),  # nothing set
        (["run", "--merge-threads", "0"], ENV),
        (["verify"], {**VERIFY, "WALBRIDGE_LOG_LEVEL": "LOUD"}),
        (["run"], {**ENV, "WALBRIDGE_SPARK_MASTR": "local[1]"}),
    ],
)
def test_every_configuration_error_exits_2_before_spark_starts(
    argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_consumer import __main__ as cli

    for name in [n for n in cli.os.environ if n.startswith("WALBRIDGE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(argv) == 2
