"""MkDocs hook: the configuration reference, rendered at build time from the settings declarations.

The producer's and the consumer's settings are declared once, with `schemas.settings_loader.setting`
(the declarations that also make `--help`). This hook reads those declarations while the site is
built and puts one table per command where a page holds `MARKER`, so the reference cannot drift
from `--help` and nothing generated is committed. `render_reference` is pure (unit-tested); only
`on_page_markdown` imports the configuration classes.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# The checkout being built, before whatever copy of walbridge the virtualenv has installed (an
# editable install may point at another worktree).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from schemas import settings  # noqa: E402
from schemas.client_config import SECRET_FILES  # noqa: E402
from schemas.settings_loader import Setting, declared, shown_default  # noqa: E402

MARKER = "<!-- walbridge:settings-reference -->"


@dataclass(frozen=True)
class Command:
    """One command's settings: where they are declared and whether they have flags."""

    name: str
    declaration: str  # "module:Class"
    about: str
    has_flags: bool = True


COMMANDS: tuple[Command, ...] = (
    Command(
        "walbridge-producer run",
        "producer.config:ProducerConfig",
        "The producer (`python -m producer run`). What the settings mean in practice: "
        "[Producer](producer.md), [Snapshots](snapshots.md), "
        "[PostgreSQL versions](postgresql-versions.md), [Guarantees](guarantees.md).",
    ),
    Command(
        "walbridge-producer snapshot",
        "producer.snapshot.signal:SnapshotRequest",
        "Asks the running producer to snapshot the tables named as arguments "
        "([Snapshots](snapshots.md#the-signal)).",
    ),
    Command(
        "walbridge-consumer run",
        "spark_consumer.config:ConsumerConfig",
        "The Spark consumer (`python -m spark_consumer run`): see [Consumer and lake](lake.md).",
    ),
    Command(
        "walbridge-consumer verify",
        "spark_consumer.config:VerifyConfig",
        "Compares PostgreSQL's tables with the lake's ([verify](lake.md#verify)).",
    ),
    Command(
        "walbridge-consumer maintain (and status)",
        "spark_consumer.config:MaintainConfig",
        "Compaction and VACUUM of every lake table, once; `status` prints the lake's files "
        "and retention ([Lake maintenance](lake-maintenance.md)).",
    ),
    Command(
        "Spark session (walbridge-consumer run and verify)",
        "spark_consumer.config:SparkSettings",
        "Variables only: deployment facts, set once per pod, not per command.",
        has_flags=False,
    ),
)


def render_reference(
    commands: Iterable[tuple[Command, Sequence[Setting]]],
    secret_files: Iterable[str],
    stack_variables: Iterable[str],
) -> str:
    """The reference's Markdown: a table per command, then the secret files and stack names."""
    parts = []
    for command, declared_settings in commands:
        parts.append(f"## {command.name}\n\n{command.about}\n\n")
        parts.append(render_table(declared_settings, has_flags=command.has_flags))
    parts.append(
        "## Secrets from files\n\n"
        "Each of these names a file whose content is the setting (one trailing newline "
        "dropped), as Kubernetes mounts a secret; setting both a variable and its `_FILE` is "
        "an error. The producer and the consumer read the same ones.\n\n"
        + "".join(f"- `{name}`\n" for name in sorted(secret_files))
        + "\n"
    )
    parts.append(
        "## The local stack's variables\n\n"
        "Read by `deploy/local/stack` (and accepted by both tools, so one shell can carry "
        "them all): see [The local stack](local-stack.md).\n\n"
        + "".join(f"- `{name}`\n" for name in sorted(stack_variables))
    )
    return "".join(parts)


def render_table(declared_settings: Sequence[Setting], *, has_flags: bool = True) -> str:
    """One Markdown table row per setting: variable, flag, default and `--help`'s description."""
    head = "| variable | flag | default | description |\n|---|---|---|---|\n"
    if not has_flags:
        head = "| variable | default | description |\n|---|---|---|\n"
    rows = []
    for s in declared_settings:
        cells = [f"`{s.env}`"]
        if has_flags:
            cells.append(_flags(s))
        cells.append(_default(s))
        cells.append(_escape(s.help) + (" (secret: never shown)" if s.secret else ""))
        rows.append("| " + " | ".join(cells) + " |\n")
    return head + "".join(rows) + "\n"


def _flags(s: Setting) -> str:
    if s.is_bool:
        return f"`--{s.flag}`, `--no-{s.flag}`"
    return f"`--{s.flag}`"


def _default(s: Setting) -> str:
    # The words `--help` uses ("required", "default: unset", "default X"), less the prefix.
    shown = shown_default(s).removeprefix("default: ").removeprefix("default ")
    return shown if s.required or shown == "unset" else f"`{shown}`"


def _escape(text: str) -> str:
    """Plain text as Markdown table-cell text: nothing in it may start markup or end the cell."""
    for char in "\\`*_[]>|":
        text = text.replace(char, "\\" + char)
    return text.replace("<", "&lt;")  # Python-Markdown has no escape for "<"


def _settings_of(command: Command) -> list[Setting]:
    module_name, class_name = command.declaration.split(":")
    return declared(getattr(importlib.import_module(module_name), class_name))


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    reference = render_reference(
        ((command, _settings_of(command)) for command in COMMANDS),
        SECRET_FILES,
        settings.LOCAL_STACK,
    )
    return markdown.replace(MARKER, reference)
