"""Per-table lake options (spark_consumer/lake_options.py): parsing, validation, exit 2."""

from __future__ import annotations

import os

import pytest

from schemas.safe_names import lake_table_path
from spark_consumer import lake_options
from spark_consumer.__main__ import main
from spark_consumer.config import parse_run
from spark_consumer.consistent_read import with_layouts
from spark_consumer.errors import ConfigError
from spark_consumer.lake_options import (
    LakeOptions,
    TableOptions,
    changelog_name,
    changelog_path,
    history_name,
    history_path,
    parse,
)

BASE_ENV = {
    "WALBRIDGE_KAFKA_BOOTSTRAP": "localhost:9092",
    "WALBRIDGE_SCHEMA_REGISTRY_URL": "http://localhost:8081",
    "WALBRIDGE_TOPIC_PREFIX": "db",
    "WALBRIDGE_LAKE_PATH": "/tmp/lake",
}


def test_no_file_is_todays_behaviour() -> None:
    config = parse_run([], BASE_ENV)
    assert config.lake_tables_config == LakeOptions()
    assert config.lake_tables_config.of("public", "orders").plain


def test_full_example_parses_to_typed_options() -> None:
    opts = parse(
        """
        [tables."public.orders"]
        history = true
        changelog = true
        deletes = "soft"
        change_data_feed = true
        except_columns = ["card_number"]
        ignore_columns = ["updated_at"]

        [tables.'"My Schema"."a.b"']
        columns = ["id", "amount"]
        """
    )
    orders = opts.of("public", "orders")
    assert orders == TableOptions(
        history=True,
        changelog=True,
        deletes="soft",
        change_data_feed=True,
        except_columns=("card_number",),
        ignore_columns=("updated_at",),
    )
    assert orders.soft_deletes and orders.tracks_subset
    assert opts.of_collection("public.orders") == orders
    odd = opts.of("My Schema", "a.b")
    assert odd.columns == ("id", "amount")
    assert opts.of("public", "other").plain


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ('[tables."public.t"]\nhistroy = true', ["public.t", "histroy"]),
        ('[tables."public.t"]\nhistory = "yes"', ["public.t", "history"]),
        ('[tables."public.t"]\ndeletes = "archive"', ["public.t", "deletes"]),
        ('[tables."public.t"]\ncolumns = ["a"]\nexcept_columns = ["b"]', ["except_columns"]),
        (
            '[tables."public.t"]\nhistory = true\ntrack_columns = ["a"]\nignore_columns = ["b"]',
            ["ignore_columns"],
        ),
        ('[tables."public.t"]\ntrack_columns = ["a"]', ["track_columns", "history"]),
        (
            '[tables."public.t"]\nhistory = true\nexcept_columns = ["a"]\ntrack_columns = ["a"]',
            ["track_columns", "'a'"],
        ),
        ('[tables."public.t"]\ncolumns = []', ["columns"]),
        ('[tables."public.t"]\ncolumns = ["a", "a"]', ["columns", "twice"]),
        ('[tables."nodot"]\nhistory = true', ["nodot"]),
        ("[other]\nx = 1", ["other"]),
        ("[tables", ["TOML"]),
    ],
)
def test_mistakes_name_the_table_and_option(body: str, names: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse(body, "t.toml")
    for name in names:
        assert name in str(err.value)


def test_unknown_table_is_refused_when_the_tables_are_known(tmp_path) -> None:
    path = tmp_path / "lake.toml"
    path.write_text('[tables."public.orders"]\nchangelog = true\n')
    env = {**BASE_ENV, "WALBRIDGE_LAKE_TABLES_CONFIG": str(path)}
    assert (
        parse_run([], {**env, "WALBRIDGE_TABLES": "public.orders"})
        .lake_tables_config.of("public", "orders")
        .changelog
    )
    with pytest.raises(ConfigError, match=r"public\.orders.*WALBRIDGE_TABLES"):
        parse_run([], {**env, "WALBRIDGE_TABLES": "public.payments"})


def test_bad_file_exits_2_naming_table_and_option(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "lake.toml"
    path.write_text('[tables."public.orders"]\nhistory = true\nsoft_deletes = true\n')
    for k in [k for k in os.environ if k.startswith("WALBRIDGE_")]:
        monkeypatch.delenv(k)  # only this test's settings
    for k, v in {**BASE_ENV, "WALBRIDGE_LAKE_TABLES_CONFIG": str(path)}.items():
        monkeypatch.setenv(k, v)
    assert main(["run", "--available-now"]) == 2
    err = capsys.readouterr().err
    assert "public.orders" in err and "soft_deletes" in err
    monkeypatch.setenv("WALBRIDGE_LAKE_TABLES_CONFIG", str(tmp_path / "missing.toml"))
    assert main(["run", "--available-now"]) == 2
    assert "missing.toml" in capsys.readouterr().err


def test_columns_and_companions() -> None:
    only = TableOptions(columns=("id", "ts"))
    assert only.kept(("id", "ts", "ts__text", "secret", "secret__bytes")) == (
        "id",
        "ts",
        "ts__text",
    )
    hidden = TableOptions(except_columns=("secret",))
    assert hidden.kept(("id", "secret", "secret__bytes", "secret_2")) == ("id", "secret_2")
    tracked = TableOptions(history=True, track_columns=("price",))
    assert tracked.tracked("price") and tracked.tracked("price__text")
    assert not tracked.tracked("note")
    ignoring = TableOptions(history=True, ignore_columns=("note",))
    assert ignoring.tracked("price") and not ignoring.tracked("note")
    assert not TableOptions(history=True).tracks_subset


def test_paths_and_progress_names_follow_the_name_rule() -> None:
    assert lake_options.history_path("/l/", "public", "orders") == (
        "/l/_walbridge/history/public/orders"
    )
    weird = lake_options.changelog_path("s3a://b/l", "My Schema", "a.b")
    assert weird.startswith("s3a://b/l/_walbridge/changelog/My_Schema_")
    assert "/" not in weird.rsplit("/changelog/", 1)[1].replace("/", "", 1)
    assert lake_options.history_name("public.orders") == "history:public.orders"
    assert lake_options.changelog_name("public.orders") == "changelog:public.orders"


def test_a_layouts_extra_tables_are_named_as_in_the_progress_row() -> None:
    """What batch.py hands to the Delta checkpoints (and compaction) besides the table."""
    from spark_consumer.lake_layouts import Layout

    opts = parse('[tables."public.orders"]\nhistory = true\nchangelog = true\n')
    layout = Layout(opts.of_collection("public.orders"), "public.orders", "/l", "public", "orders")
    assert layout.extra_tables == {
        "history:public.orders": "/l/_walbridge/history/public/orders",
        "changelog:public.orders": "/l/_walbridge/changelog/public/orders",
    }
    plain = Layout(opts.of_collection("public.other"), "public.other", "/l", "public", "other")
    assert plain.extra_tables == {}


def test_a_consistent_read_maps_the_layouts_names_beside_the_table_path() -> None:
    def plain(name: str) -> str:
        schema, table = name.split(".")
        return lake_table_path("/lake/", schema, table)

    path = with_layouts("/lake/", plain)
    assert path("public.orders") == "/lake/public/orders"
    assert path(history_name("public.orders")) == history_path("/lake", "public", "orders")
    assert path(changelog_name("public.orders")) == changelog_path("/lake", "public", "orders")
    assert path("history.orders") == "/lake/history/orders"  # a schema named history
