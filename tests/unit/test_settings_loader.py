"""schemas.settings_loader: one declaration per setting, the same rules for both tools."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from schemas.settings_loader import (
    SettingsError,
    declared,
    parse_bool,
    parser_for,
    read_settings,
    setting,
)

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Example:
    kafka_bootstrap: str = setting(help="brokers")
    exactly_once: bool = setting(True, help="transactions")
    linger_ms: int = setting(10, help="linger")
    metrics_port: int = setting(9465, env="WALBRIDGE_CONSUMER_METRICS_PORT", help="port")
    pg_dsn: str = setting("", help="dsn", secret=True)
    plain: int = 0  # not a setting: no flag, no variable


def read(argv: list[str], env: dict[str, str] | None = None) -> dict[str, object]:
    return read_settings(Example, argv, env or {}, prog="example")


def test_names_follow_the_field_unless_declared() -> None:
    by_name = {s.name: s for s in declared(Example)}
    assert set(by_name) == {
        "kafka_bootstrap",
        "exactly_once",
        "linger_ms",
        "metrics_port",
        "pg_dsn",
    }
    assert (by_name["linger_ms"].flag, by_name["linger_ms"].env) == (
        "linger-ms",
        "WALBRIDGE_LINGER_MS",
    )
    assert by_name["metrics_port"].env == "WALBRIDGE_CONSUMER_METRICS_PORT"
    assert by_name["kafka_bootstrap"].required and not by_name["linger_ms"].required


@pytest.mark.parametrize(
    ("text", "value"),
    [("1", True), ("TRUE", True), (" yes", True), ("on", True), ("0", False), ("False", False),
     ("no", False), ("off", False)],
)  # fmt: skip
def test_one_boolean_parser(text: str, value: bool) -> None:
    assert parse_bool(text) is value


def test_parse_bool_refuses_anything_else() -> None:
    with pytest.raises(ValueError, match=r"expected true/false.*got 'maybe'"):
        parse_bool("maybe")
    # A value taken by mistake (the flag's value is optional) is not echoed: it may be a DSN.
    with pytest.raises(ValueError) as refused:
        parse_bool("postgresql://u:hunter2@db/app")
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--exactly-once"], True), (["--exactly-once", "false"], False),
     (["--no-exactly-once"], False), (["--exactly-once=yes"], True)],
)  # fmt: skip
def test_boolean_flags(argv: list[str], expected: bool) -> None:
    assert read(["--kafka-bootstrap", "k", *argv])["exactly_once"] is expected


def test_only_given_settings_are_returned_parsed() -> None:
    given = read(["--linger-ms", "5"], {"WALBRIDGE_KAFKA_BOOTSTRAP": "k", "WALBRIDGE_PG_DSN": ""})
    assert given == {"kafka_bootstrap": "k", "linger_ms": 5}  # an empty variable is unset


def test_a_flag_and_its_variable_must_agree_after_parsing() -> None:
    env = {"WALBRIDGE_KAFKA_BOOTSTRAP": "k", "WALBRIDGE_EXACTLY_ONCE": "yes"}
    assert read(["--exactly-once", "true"], env)["exactly_once"] is True
    with pytest.raises(
        SettingsError, match=r"--linger-ms and WALBRIDGE_LINGER_MS disagree \(5 vs 6\)"
    ):
        read(["--linger-ms", "5"], {**env, "WALBRIDGE_LINGER_MS": "6"})


def test_a_secret_is_never_echoed(capsys: pytest.CaptureFixture[str]) -> None:
    env = {"WALBRIDGE_KAFKA_BOOTSTRAP": "k", "WALBRIDGE_PG_DSN": "password=hunter2"}
    with pytest.raises(SettingsError) as info:
        read(["--pg-dsn", "password=hunter3"], env)
    assert "disagree" in str(info.value) and "hunter" not in str(info.value)
    with pytest.raises(SettingsError, match="invalid command line"):
        read(["--pg-dsn=password=hunter3", "--bogus"], env)
    assert "hunter" not in capsys.readouterr().err
    assert "hunter" not in parser_for(Example, "example", "").format_help()


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        ([], {}, r"missing required setting\(s\): --kafka-bootstrap / WALBRIDGE_KAFKA_BOOTSTRAP"),
        (["--kafka-bootstrap", ""], {}, r"missing required setting\(s\): --kafka-bootstrap"),
        ([], {"WALBRIDGE_KAFKA_BOOTSTRAP": ""}, r"missing required setting\(s\): --kafka-bootstrap"),
        ([], {"WALBRIDGE_KAFKA_BOOTSTRAP": "k", "WALBRIDGE_LINGR_MS": "1"}, "unknown environment variable.*WALBRIDGE_LINGR_MS"),
        (["--linger-ms", "soon"], {"WALBRIDGE_KAFKA_BOOTSTRAP": "k"}, "--linger-ms: invalid literal"),
        ([], {"WALBRIDGE_KAFKA_BOOTSTRAP": "k", "WALBRIDGE_EXACTLY_ONCE": "maybe"}, "WALBRIDGE_EXACTLY_ONCE: expected true/false"),
        (["--plain", "1"], {"WALBRIDGE_KAFKA_BOOTSTRAP": "k"}, "invalid command line"),
    ],
)  # fmt: skip
def test_errors_name_the_setting(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        read(argv, env)


def test_help_shows_variable_and_default() -> None:
    text = " ".join(parser_for(Example, "example", "An example.").format_help().split())
    assert "env WALBRIDGE_LINGER_MS; default 10" in text
    assert "env WALBRIDGE_KAFKA_BOOTSTRAP; required" in text
    assert "--no-exactly-once" in text


def test_a_type_without_a_parser_is_refused_at_declaration_use() -> None:
    @dataclass(frozen=True)
    class Odd:
        when: complex = setting(0j, help="?")

    with pytest.raises(TypeError, match="needs an explicit parse"):
        declared(Odd)
