"""`WALBRIDGE_TABLES`: a comma-separated list of `schema.table`, read by the producer and by
`verify` (docs/producer.md and docs/configuration.md). Pure functions.

A name is either unquoted, taken literally as written (no case folding: `Sales.Orders` is the
table `Orders` in schema `Sales`; spaces inside are kept, spaces around are not), or quoted the
PostgreSQL way, which is the only way to write a name holding a dot, comma or double quote:
`"My Schema"."a.b"`, with `""` for a quote inside (`public."say ""hi"" now"`).
"""

from __future__ import annotations


class TableListError(ValueError):
    """The list is not `schema.table[, ...]`; the message shows where."""


def _name(text: str, i: int) -> tuple[str, int]:
    """One name starting at ``text[i]`` (spaces before it skipped); returns it and the end."""
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    if i < n and text[i] == '"':
        out: list[str] = []
        i += 1
        while True:
            close = text.find('"', i)
            if close < 0:
                raise TableListError(f"unterminated quoted name in {text!r}")
            out.append(text[i:close])
            if text.startswith('""', close):
                out.append('"')
                i = close + 2
                continue
            i = close + 1
            break
        name = "".join(out)
        if not name:
            raise TableListError(f'empty quoted name "" in {text!r}')
        while i < n and text[i].isspace():
            i += 1
        return name, i
    start = i
    while i < n and text[i] not in '.,"':
        i += 1
    if i < n and text[i] == '"':
        raise TableListError(
            f"a double quote inside an unquoted name in {text!r}: quote the whole name "
            '("..." with "" for each quote in it)'
        )
    name = text[start:i].strip()
    if not name:
        raise TableListError(f"a name is missing at position {start} of {text!r}")
    return name, i


def parse_table(text: str) -> tuple[str, str]:
    """``'"My Schema"."a.b"'`` -> ``("My Schema", "a.b")``."""
    tables = parse_table_list(text)
    if len(tables) != 1:
        raise TableListError(f"{text!r} names {len(tables)} tables, expected one schema.table")
    return tables[0]


def parse_table_list(text: str) -> tuple[tuple[str, str], ...]:
    """``'public.orders, "My Schema"."a.b"'`` -> ``(("public", "orders"), ("My Schema", "a.b"))``;
    a blank text is an empty list."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and (text[i].isspace() or text[i] == ","):
            i += 1  # empty items (`a.b,,c.d`, a trailing comma) are skipped, as before
        if i >= n:
            return tuple(out)
        schema, i = _name(text, i)
        if i >= n or text[i] != ".":
            raise TableListError(
                f"table {schema!r} in {text!r} must be written as schema.table "
                '(quote names holding a dot, comma or quote: "My Schema"."a.b")'
            )
        table, i = _name(text, i + 1)
        out.append((schema, table))
        if i < n and text[i] != ",":
            raise TableListError(
                f"unexpected {text[i]!r} at position {i} of {text!r} (after {schema}.{table}); "
                'quote names holding a dot, comma or quote: "My Schema"."a.b"'
            )
        i += 1


def quote_name(name: str) -> str:
    """The form `parse_table_list` reads back: unquoted when that is unambiguous."""
    if name and name == name.strip() and not any(c in name for c in '.,"'):
        return name
    return '"' + name.replace('"', '""') + '"'


def format_table(schema: str, table: str) -> str:
    return f"{quote_name(schema)}.{quote_name(table)}"
