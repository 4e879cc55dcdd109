"""Pure: which of a table's columns a publication sends, by pgoutput's own rule, so that a
snapshot (producer) and `verify` (consumer) use exactly the columns of the stream's Relation.

pgoutput decides per column (``logicalrep_write_attrs``; on PostgreSQL 18 through
``logicalrep_should_publish_column``):

- a dropped column is never sent;
- PostgreSQL 15-17 never send a generated column (and refuse one in a column list);
- PostgreSQL 18: with a column list (``pg_publication_rel.prattrs``), exactly the listed
  columns, stored generated ones included; without one, every ordinary column, plus the stored
  generated ones when the publication has ``publish_generated_columns = stored``
  (``pg_publication.pubgencols = 's'``);
- a virtual generated column (18's default for ``GENERATED ALWAYS AS``) is never sent: it has
  no value in the WAL, and PostgreSQL refuses it in a column list.

The catalog reads behind it are in ``schemas/publication_catalog.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schemas.errors import SchemaError

# pg_attribute.attgenerated
ORDINARY = ""
STORED = "s"
VIRTUAL = "v"  # PostgreSQL 18+

# The first major whose pgoutput can send generated columns.
GENERATED_COLUMNS_SINCE = 18


class PublishedColumnsError(SchemaError):
    """The catalog says something about a column that the rule does not know."""

    def __init__(self, table: str, column: str, detail: str) -> None:
        self.table = table
        self.column = column
        self.detail = detail
        super().__init__(f"column {table}.{column}: {detail}")


@dataclass(frozen=True)
class Attribute:
    """One live (not dropped) column of the table, as pg_attribute has it."""

    attnum: int
    name: str
    generated: str  # pg_attribute.attgenerated: '' ordinary, 's' stored, 'v' virtual (18+)


@dataclass(frozen=True)
class PublicationColumns:
    """What one publication says about one table's columns."""

    publication: str
    server_major: int  # e.g. 18 (server_version_num // 10000)
    column_list: frozenset[int] | None  # pg_publication_rel.prattrs (attnums); None: no list
    publish_stored_generated: bool  # pg_publication.pubgencols = 's' (18+; always False before)


@dataclass(frozen=True)
class Selection:
    published: tuple[Attribute, ...]  # in attnum order, as the Relation message lists them
    skipped: tuple[tuple[Attribute, str], ...]  # each with why it is not sent

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.published)

    def skipped_text(self) -> tuple[str, ...]:
        """``"name (why)"`` per skipped column, for logs and reports."""
        return tuple(f"{a.name} ({why})" for a, why in self.skipped)


def select(table: str, attributes: Iterable[Attribute], pub: PublicationColumns) -> Selection:
    """The columns pgoutput sends for ``table`` (``schema.table``, for errors) under ``pub``,
    and the others with the reason. ``attributes`` need not be sorted."""
    published: list[Attribute] = []
    skipped: list[tuple[Attribute, str]] = []
    for a in sorted(attributes, key=lambda a: a.attnum):
        why = _why_not(table, a, pub)
        if why is None:
            published.append(a)
        else:
            skipped.append((a, why))
    return Selection(tuple(published), tuple(skipped))


def _why_not(table: str, a: Attribute, pub: PublicationColumns) -> str | None:
    """None when ``a`` is sent, else the reason it is not."""
    if a.generated not in (ORDINARY, STORED, VIRTUAL):
        # A new kind of column in a later release: guessing could put a column in the
        # snapshot that the stream lacks (or the opposite), so stop and say so.
        raise PublishedColumnsError(
            table, a.name, f"unknown pg_attribute.attgenerated {a.generated!r}"
        )
    if a.generated == VIRTUAL:
        return "virtual generated: never published"
    if a.generated == STORED and pub.server_major < GENERATED_COLUMNS_SINCE:
        return (
            f"stored generated: PostgreSQL {pub.server_major} does not publish generated "
            f"columns ({GENERATED_COLUMNS_SINCE}+ can)"
        )
    if pub.column_list is not None:
        if a.attnum in pub.column_list:
            return None
        return f"not in the column list of publication {pub.publication!r}"
    if a.generated == STORED and not pub.publish_stored_generated:
        return (
            f"stored generated: publication {pub.publication!r} has "
            "publish_generated_columns = none"
        )
    return None
