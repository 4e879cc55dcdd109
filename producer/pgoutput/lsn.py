"""LSNs as integers, and their ``X/Y`` text form (two hex halves of the 64-bit position)."""

from __future__ import annotations

import re

_LSN_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")
_MAX_LSN = 0xFFFFFFFFFFFFFFFF


def format_lsn(lsn: int) -> str:
    """``0x16B3748`` -> ``'0/16B3748'`` (PostgreSQL's own spelling: upper-case hex, no padding)."""
    if not 0 <= lsn <= _MAX_LSN:
        raise ValueError(f"LSN out of range: {lsn!r}")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """``'0/16B3748'`` -> ``0x16B3748``; raises ValueError for anything else."""
    match = _LSN_TEXT.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"can't parse LSN {text!r}: expected X/Y with 1-8 hex digits each")
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)
