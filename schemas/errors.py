"""The schemas package's error hierarchy: one base class, one subclass per kind of failure.

Every error carries the facts an operator needs (table, column, type, LSN, raw value) as
attributes *and* in its message, so a log line alone is enough to act on it.
"""

from __future__ import annotations


class SchemaError(Exception):
    """Base class of every error raised by ``schemas``."""


class MappingError(SchemaError):
    """A PostgreSQL type cannot be mapped (e.g. an array whose element type is unknown)."""

    def __init__(self, type_oid: int, detail: str) -> None:
        self.type_oid = type_oid
        self.detail = detail
        super().__init__(f"type oid {type_oid}: {detail}")


class ConversionError(SchemaError):
    """A pgoutput column value could not be converted to its Avro form."""

    def __init__(
        self,
        table: str,
        column: str,
        pg_type: str,
        raw: bytes,
        binary: bool,
        detail: str,
        lsn: int | None = None,
    ) -> None:
        self.table = table
        self.column = column
        self.pg_type = pg_type
        self.raw = raw
        self.binary = binary
        self.detail = detail
        self.lsn = lsn
        fmt = "binary" if binary else "text"
        where = f" at LSN {lsn}" if lsn is not None else ""
        super().__init__(
            f"can't convert {table}.{column} ({pg_type}, {fmt} value {raw[:200]!r}){where}: {detail}"
        )


class CatalogError(SchemaError):
    """A catalog look-up for a learned type failed or found nothing."""

    def __init__(self, type_oid: int, detail: str) -> None:
        self.type_oid = type_oid
        self.detail = detail
        super().__init__(f"catalog look-up of type oid {type_oid}: {detail}")


class SchemaEvolutionError(SchemaError):
    """The registry refused a new schema version (HTTP 409: incompatible with the subject).

    The producer must stop without confirming the LSN: nothing after this change is published.
    ``changes`` lists ``(column, old_type, new_type)``; ``None`` means absent on that side.
    """

    def __init__(
        self,
        table: str,
        subject: str,
        changes: tuple[tuple[str, str | None, str | None], ...],
        registry_message: str,
        lsn: int | None = None,
    ) -> None:
        self.table = table
        self.subject = subject
        self.changes = changes
        self.registry_message = registry_message
        self.lsn = lsn
        described = (
            "; ".join(
                f"column {col!r}: {old or '(absent)'} -> {new or '(absent)'}"
                for col, old, new in changes
            )
            or "no column difference known to this producer"
        )
        where = f" at LSN {lsn}" if lsn is not None else ""
        super().__init__(
            f"registry refused the new schema of {table} under subject {subject!r}{where} "
            f"({described}): {registry_message}. Resolve by making the change compatible "
            f"(e.g. add the column instead of retyping it), or by changing the subject's "
            f"compatibility level / registering the schema by hand, then restart the producer."
        )


class RegistryUnavailableError(SchemaError):
    """The registry stayed unreachable after every configured retry."""

    def __init__(self, subject: str, attempts: int, detail: str) -> None:
        self.subject = subject
        self.attempts = attempts
        self.detail = detail
        super().__init__(
            f"schema registry unreachable for subject {subject!r} after {attempts} attempt(s): {detail}"
        )


class RegistryError(SchemaError):
    """The registry answered with an error other than an incompatibility."""

    def __init__(self, subject: str, status: int, code: int, detail: str) -> None:
        self.subject = subject
        self.status = status
        self.code = code
        self.detail = detail
        super().__init__(
            f"schema registry error for subject {subject!r} (HTTP {status}, code {code}): {detail}"
        )
