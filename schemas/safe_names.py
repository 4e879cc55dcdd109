"""PostgreSQL names as Kafka topic parts and lake directory names: one rule, pure functions
(CONTRACT.md, "Names").

PostgreSQL allows any character in a quoted identifier (spaces, quotes, dots, slashes, `..`,
non-ASCII letters). Kafka topic names allow only ASCII letters, digits, `.`, `_` and `-`; a dot
inside a name would make `<prefix>.<schema>.<table>` ambiguous; and a lake directory must never
be `..` or hold a `/`. So a name is used unchanged when it is made only of ASCII letters, digits,
`_` and `-` (every name that was already valid keeps its topic and lake path); otherwise each
other character becomes its ASCII letters when it has them (`é` -> `e`, `Ü` -> `U`) or `_`,
and `_` plus the first 8 hex digits of the SHA-256 of the name's UTF-8 bytes is appended, so two
names that read the same after replacement (`a.b`, `a b`) still differ. The suffix makes a clash
astronomically unlikely; `TableTopics` still refuses one, rather than mixing two tables.

Like Debezium's replacement of invalid characters, but with the digest: Debezium maps `a.b` and
`a b` to the same `a_b` and lets the two tables share a topic.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

_SAFE = re.compile(r"[A-Za-z0-9_-]+")
_SAFE_CHAR = re.compile(r"[A-Za-z0-9_-]")
# `_walbridge` is the lake's own directory (progress, pending, checkpoint): a schema of that name
# must not land there.
RESERVED = frozenset({"_walbridge"})
# Longest readable part kept before the suffix: PostgreSQL names are at most 63 bytes, but a
# character's compatibility decomposition can be long (U+FDFA is 18 letters).
MAX_READABLE = 63
DIGEST_HEX = 8


def is_safe(name: str) -> bool:
    """Whether ``name`` is used unchanged as a topic part and lake directory."""
    return bool(_SAFE.fullmatch(name)) and name not in RESERVED


def _ascii(char: str) -> str:
    if _SAFE_CHAR.match(char):
        return char
    # NFKD splits `é` into `e` + a combining accent; keep the letters if that is all there is.
    base = "".join(c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c))
    return base if base and _SAFE.fullmatch(base) else "_"


def name_part(name: str) -> str:
    """The topic part and lake directory of one PostgreSQL schema or table name."""
    if not name:
        raise ValueError("an empty name has no topic part")
    if is_safe(name):
        return name
    readable = "".join(_ascii(c) for c in name)[:MAX_READABLE]
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:DIGEST_HEX]
    return f"{readable}_{digest}"


def lake_table_path(lake: str, schema: str, table: str) -> str:
    """`<lake>/<schema part>/<table part>`: always a directory two levels below the lake."""
    return f"{lake.rstrip('/')}/{name_part(schema)}/{name_part(table)}"
