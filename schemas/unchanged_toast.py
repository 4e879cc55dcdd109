"""The unchanged-TOAST sentinel: a column value PostgreSQL did not send (pgoutput's 'u').

It lives in the contract package because both the decoder (which produces it) and the row
encoders (which turn it into the envelope's `unchanged_toast` list, never a null or a
real-looking value) depend on it.
"""

from __future__ import annotations

import enum
from typing import Final


class UnchangedToast(enum.Enum):
    """Type of the UNCHANGED_TOAST singleton ('u': a TOASTed value the server did not send)."""

    UNCHANGED_TOAST = "u"

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Final = UnchangedToast.UNCHANGED_TOAST
