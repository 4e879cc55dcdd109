"""Per-table lake options, pure: the TOML file `WALBRIDGE_LAKE_TABLES_CONFIG` names, parsed and
validated into typed options (CONTRACT.md, "Lake"; docs/lake-layouts.md).

    [tables."public.orders"]
    history = true
    changelog = true

Tables are named as in `WALBRIDGE_TABLES` (quoting included). Every mistake is a ConfigError
naming the table and the option, so the consumer exits 2 before Spark starts: an unknown table
(when the tables are known), an unknown option, a value of the wrong type, and options that
contradict each other. No file: every table keeps the default, today's behaviour.

Also where the paths of a table's history and changelog tables, and their names in the progress
row's `table_versions`, are spelled: one home for that part of the contract.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from schemas.safe_names import name_part
from schemas.table_list import TableListError, parse_table
from spark_consumer.errors import ConfigError

HARD, SOFT = "hard", "soft"
HISTORY_PREFIX = "history:"
CHANGELOG_PREFIX = "changelog:"


@dataclass(frozen=True)
class TableOptions:
    """One table's options; the defaults are the plain current-state table."""

    history: bool = False
    changelog: bool = False
    deletes: str = HARD  # HARD or SOFT
    change_data_feed: bool = False
    columns: tuple[str, ...] | None = None  # None: every column
    except_columns: tuple[str, ...] = ()
    track_columns: tuple[str, ...] | None = None  # None: every column (history only)
    ignore_columns: tuple[str, ...] = ()

    @property
    def plain(self) -> bool:
        return self == TableOptions()

    @property
    def soft_deletes(self) -> bool:
        return self.deletes == SOFT

    def kept(self, columns: Iterable[str]) -> tuple[str, ...]:
        """The lake columns that may be written, in their order (`columns`/`except_columns`).

        A companion column (`c__text`, `c__shape`, `c__bytes`) goes with its source column:
        excluding `c` excludes them too, and including `c` includes them."""
        return tuple(c for c in columns if self.keeps(c))

    def keeps(self, column: str) -> bool:
        names = _names_of(column)
        if self.columns is not None and not names & set(self.columns):
            return False
        return not names & set(self.except_columns)

    def tracked(self, column: str) -> bool:
        """Whether a change of the column opens a new history version."""
        names = _names_of(column)
        if self.track_columns is not None:
            return bool(names & set(self.track_columns))
        return not names & set(self.ignore_columns)

    @property
    def tracks_subset(self) -> bool:
        """Whether some columns are untracked (then a change of only those updates in place)."""
        return self.track_columns is not None or bool(self.ignore_columns)


# The companion columns a source column may have (conversions.py): they follow its option.
_COMPANIONS = ("__text", "__bytes", "__shape")


def _names_of(column: str) -> set[str]:
    """The column itself and, for a companion `c__text`, its source column `c`."""
    return {column} | {column[: -len(s)] for s in _COMPANIONS if column.endswith(s)}


_KINDS: dict[str, str] = {
    "history": "bool",
    "changelog": "bool",
    "deletes": "deletes",
    "change_data_feed": "bool",
    "columns": "names",
    "except_columns": "names",
    "track_columns": "names",
    "ignore_columns": "names",
}


@dataclass(frozen=True)
class LakeOptions:
    """Options by table (schema, table); a table not listed has the defaults."""

    tables: Mapping[tuple[str, str], TableOptions] = field(default_factory=dict)
    source: str = ""  # the file read, for messages

    def of(self, schema: str, table: str) -> TableOptions:
        return self.tables.get((schema, table), _DEFAULT)

    def of_parts(self, schema_part: str, table_part: str) -> TableOptions:
        """By the topic's parts of the names (`safe_names.name_part`, unique per table)."""
        return self._by_parts.get((schema_part, table_part), _DEFAULT)

    @cached_property
    def _by_parts(self) -> dict[tuple[str, str], TableOptions]:
        return {(name_part(s), name_part(t)): o for (s, t), o in self.tables.items()}

    def of_collection(self, collection: str) -> TableOptions:
        """By the progress row's name of a table (`schema.table`, unquoted)."""
        return self._by_collection.get(collection, _DEFAULT)

    @cached_property
    def _by_collection(self) -> dict[str, TableOptions]:
        return {f"{s}.{t}": o for (s, t), o in self.tables.items()}

    def check_known(self, known: Iterable[tuple[str, str]]) -> None:
        """Stop on a table that is not among the tables the consumer is told about."""
        known_set = set(known)
        for schema, table in self.tables:
            if (schema, table) not in known_set:
                raise ConfigError(
                    f"{self.source or 'lake tables config'}: table {schema}.{table} is not one "
                    "of WALBRIDGE_TABLES"
                )


_DEFAULT = TableOptions()


def _fail(source: str, table: str, option: str, why: str) -> ConfigError:
    return ConfigError(f"{source}: [tables.{table!r}] option {option!r}: {why}")


def _value(source: str, table: str, option: str, value: Any) -> Any:
    kind = _KINDS[option]
    if kind == "bool":
        if not isinstance(value, bool):
            raise _fail(source, table, option, f"must be true or false, got {value!r}")
        return value
    if kind == "deletes":
        if value not in (HARD, SOFT):
            raise _fail(source, table, option, f'must be "hard" or "soft", got {value!r}')
        return value
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(source, table, option, f"must be a list of column names, got {value!r}")
    if len(set(value)) != len(value):
        raise _fail(source, table, option, f"names a column twice: {value!r}")
    return tuple(value)


def _table_options(source: str, table: str, raw: Any) -> TableOptions:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: [tables.{table!r}] must be a table of options")
    for option in raw:
        if option not in _KINDS:
            raise _fail(source, table, option, f"unknown option (known: {sorted(_KINDS)})")
    values = {k: _value(source, table, k, v) for k, v in raw.items()}
    opts = TableOptions(**values)
    for a, b in (("columns", "except_columns"), ("track_columns", "ignore_columns")):
        if a in raw and b in raw:
            raise _fail(source, table, b, f"conflicts with {a!r}: give one of the two")
    for option in ("track_columns", "ignore_columns"):
        if option in raw and not opts.history:
            raise _fail(source, table, option, "needs history = true")
    for option in ("track_columns", "ignore_columns"):
        left_out = [c for c in values.get(option, ()) if not opts.keeps(c)]
        if left_out:
            raise _fail(
                source, table, option, f"names column(s) {left_out} that the lake leaves out"
            )
    if opts.columns is not None and not opts.columns:
        raise _fail(source, table, "columns", "an empty list would leave no column")
    return opts


def parse(text: str, source: str = "lake tables config") -> LakeOptions:
    """The options in a TOML text; ConfigError naming the table and option on any mistake."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"tables"})
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {unknown} (only [tables.*])")
    raw_tables = doc.get("tables", {})
    if not isinstance(raw_tables, dict):
        raise ConfigError(f"{source}: 'tables' must be a table of [tables.\"schema.table\"]")
    tables: dict[tuple[str, str], TableOptions] = {}
    for name, raw in raw_tables.items():
        try:
            key = parse_table(name)
        except TableListError as exc:
            raise ConfigError(f"{source}: table {name!r}: {exc}") from None
        if key in tables:
            raise ConfigError(f"{source}: table {name!r} is configured twice")
        tables[key] = _table_options(source, name, raw)
    return LakeOptions(tables, source)


def load(path: str) -> LakeOptions:
    """The options in the file at `path`; no path ("") gives no options."""
    if not path:
        return LakeOptions()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(
            f"WALBRIDGE_LAKE_TABLES_CONFIG: cannot read {path!r}: {exc.strerror}"
        ) from None
    return parse(text, path)


def history_path(lake: str, schema: str, table: str) -> str:
    """`<lake>/_walbridge/history/<schema part>/<table part>` (the name rule of the tables)."""
    return f"{lake.rstrip('/')}/_walbridge/history/{name_part(schema)}/{name_part(table)}"


def changelog_path(lake: str, schema: str, table: str) -> str:
    return f"{lake.rstrip('/')}/_walbridge/changelog/{name_part(schema)}/{name_part(table)}"


def history_name(collection: str) -> str:
    """The history table's key in the progress row's `table_versions`."""
    return HISTORY_PREFIX + collection


def changelog_name(collection: str) -> str:
    return CHANGELOG_PREFIX + collection
