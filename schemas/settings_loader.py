"""One way to declare a setting and read it from a flag or its WALBRIDGE_* variable.

A tool's configuration is a frozen dataclass whose fields are declared with `setting()`: the
name, type and default are the field's, the help text and the variable name are the
declaration's. `read_settings` reads a command line and an environment against it and returns
what was given; the dataclass then applies its defaults and validates in `__post_init__`, so a
configuration built in a test is checked exactly as one read from a pod's environment.

The rules, the same for the producer and the consumer:
- setting ``x_y`` has the flag ``--x-y`` and the variable ``WALBRIDGE_X_Y`` unless declared otherwise;
- a boolean is ``--x``, ``--x true|false`` or ``--no-x``, and ``1/0, true/false, yes/no, on/off``
  in a variable (`parse_bool`, the one boolean parser);
- a flag and a variable that disagree are an error (which one was meant is a guess no tool
  should make); an empty value counts as unset, in a variable or on the command line;
- an unknown WALBRIDGE_* variable is an error (a typo would otherwise be ignored), where
  "known" means owned by any tool (`schemas.settings`), since one shell carries them all;
- a secret (a DSN, a Kafka or registry setting that may hold a password) is never echoed in an
  error, a repr or the help text.

argparse parses the command line (flags as text, converted here so a flag and its variable go
through the same parser); this module only adds the variable, the disagreement check and the
declaration, which argparse has no notion of.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass
from typing import Any, Final

from schemas import settings
from schemas.client_config import ClientConfigError, with_secret_files

_KEY: Final = "walbridge.setting"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
# Field types whose parser follows from the annotation (modules use `from __future__ import
# annotations`, so annotations arrive as text); any other type declares its own `parse`.
_PARSERS: Final[dict[str, Callable[[str], Any]]] = {
    "str": str,
    "str | None": str,
    "int": int,
    "int | None": int,
    "float": float,
}


class SettingsError(ValueError):
    """A setting is missing, unknown, malformed or given twice with different values."""


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    # Echoed only when it looks like a mistyped word: `--create-topics "$DSN"` (a flag whose
    # value is optional takes the next argument) must not print a password.
    shown = f", got {text!r}" if len(text) <= 12 and text.isalnum() else ""
    raise ValueError(f"expected true/false (1/0, yes/no, on/off){shown}")


@dataclass(frozen=True)
class Declaration:
    help: str
    env: str | None = None
    flag: str | None = None
    secret: bool = False
    parse: Callable[[str], Any] | None = None


@dataclass(frozen=True)
class Setting:
    """A declared field, resolved: its flag, variable and parser."""

    name: str
    flag: str
    env: str
    help: str
    secret: bool
    is_bool: bool
    parse: Callable[[str], Any]
    default: Any  # MISSING: required

    @property
    def required(self) -> bool:
        return self.default is MISSING

    def where(self) -> str:
        return f"--{self.flag} / {self.env}"


def setting(
    default: Any = MISSING,
    *,
    help: str,
    env: str | None = None,
    flag: str | None = None,
    secret: bool = False,
    parse: Callable[[str], Any] | None = None,
    default_factory: Callable[[], Any] | None = None,
) -> Any:
    """Declare a dataclass field as a setting (see the module doc). A secret stays out of repr."""
    declaration = Declaration(help, env, flag, secret, parse)
    metadata = {_KEY: declaration}
    if default_factory is not None:
        return dataclasses.field(
            default_factory=default_factory, repr=not secret, metadata=metadata
        )
    return dataclasses.field(default=default, repr=not secret, metadata=metadata)


def declared(cls: type) -> list[Setting]:
    """The settings `cls` declares, in field order."""
    out = []
    for f in dataclasses.fields(cls):
        declaration = f.metadata.get(_KEY)
        if declaration is None:
            continue
        kind = str(f.type)
        is_bool = kind == "bool"
        parse = declaration.parse or (parse_bool if is_bool else _PARSERS.get(kind))
        if parse is None:
            raise TypeError(f"{cls.__name__}.{f.name}: type {kind} needs an explicit parse")
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()
        else:
            default = MISSING
        out.append(
            Setting(
                name=f.name,
                flag=declaration.flag or f.name.replace("_", "-"),
                env=declaration.env or settings.PREFIX + f.name.upper(),
                help=declaration.help,
                secret=declaration.secret,
                is_bool=is_bool,
                parse=parse,
                default=default,
            )
        )
    return out


def parser_for(cls: type, prog: str, description: str) -> argparse.ArgumentParser:
    """The command line of `cls`'s settings. Every flag defaults to None (not given)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"{description} Every flag can also be set by the variable its help names.",
        allow_abbrev=False,
    )
    for s in declared(cls):
        text = f"{s.help} (env {s.env}; {shown_default(s)})"
        if s.is_bool:
            group = parser.add_mutually_exclusive_group()
            group.add_argument(
                f"--{s.flag}", dest=s.name, nargs="?", const="true", default=None,
                metavar="true|false", help=text,
            )  # fmt: skip
            group.add_argument(
                f"--no-{s.flag}", dest=s.name, action="store_const", const="false",
                help=f"same as --{s.flag} false",
            )  # fmt: skip
        else:
            parser.add_argument(f"--{s.flag}", dest=s.name, default=None, help=text)
    return parser


def read_settings(
    cls: type,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    prog: str,
    description: str = "",
) -> dict[str, Any]:
    """The settings given on the command line or in the environment, parsed: pass them to `cls`.

    Raises SettingsError (see the module doc); `--help` exits through argparse as usual.
    """
    flags = parse_command_line(parser_for(cls, prog, description), argv)
    return settings_from(cls, vars(flags), env)


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """For a command with arguments of its own (e.g. positional names) beside its settings:
    `parser_for`, add them, parse here, then `settings_from`."""
    try:
        return parser.parse_args(list(argv))
    except SystemExit as exc:
        if exc.code == 0:  # --help
            raise
        # argparse printed the reason; echoing argv could print a DSN or a SASL password.
        raise SettingsError("invalid command line (see above)") from exc


def settings_from(cls: type, flags: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """`cls`'s settings from parsed flags (text, as `parser_for` leaves them) and variables."""
    unknown = settings.unknown(env)
    if unknown:
        raise SettingsError(f"unknown environment variable(s): {', '.join(unknown)}")
    try:
        env = with_secret_files(env)  # WALBRIDGE_<NAME>_FILE: a secret mounted as a file
    except ClientConfigError as exc:
        raise SettingsError(str(exc)) from None
    given: dict[str, Any] = {}
    missing = []
    for s in declared(cls):
        # Empty counts as not given, on the command line as in the environment: `--lake-path
        # "$UNSET"` must not pass for a lake at the filesystem's root.
        from_flag = _parsed(s, flags[s.name] or None, f"--{s.flag}")
        from_env = _parsed(s, env.get(s.env) or None, s.env)
        if from_flag is not None and from_env is not None and from_flag != from_env:
            shown = "" if s.secret else f" ({from_flag!r} vs {from_env!r})"
            raise SettingsError(f"--{s.flag} and {s.env} disagree{shown}; set one")
        value = from_flag if from_flag is not None else from_env
        if value is not None:
            given[s.name] = value
        elif s.required:
            missing.append(s.where())
    if missing:
        raise SettingsError(f"missing required setting(s): {', '.join(missing)}")
    return given


def _parsed(s: Setting, text: str | None, source: str) -> Any:
    if text is None:
        return None
    try:
        return s.parse(text)
    except (ValueError, ClientConfigError) as exc:
        # The parsers of secrets (client_config's) name keys and positions, never values.
        raise SettingsError(f"{source}: {exc}") from None


def shown_default(s: Setting) -> str:
    """How `--help` and the generated configuration reference (docs/) show a default."""
    if s.required:
        return "required"
    if s.secret or s.default in ("", None) or s.default == {}:
        return "default: unset"
    value = getattr(s.default, "value", s.default)  # an Enum shows its value
    return f"default {value}"
