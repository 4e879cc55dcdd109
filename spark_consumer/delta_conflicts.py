"""Delta's commit conflicts (another writer committed to the table meanwhile: an OPTIMIZE, ours
or a user's, a VACUUM's log entries, a property change) and the retry that survives them.

Delta commits optimistically: a transaction that finds a conflicting commit in between raises
one of `delta.exceptions`' classes and has written nothing to the log. So the table's work can
be done again from a fresh read of the table. Doing it again is safe for every write the
consumer makes: a MERGE is guarded by each row's (commit_lsn, total_order), so rows that an
earlier attempt's commit did apply are left alone; the pending table is overwritten whole; the
progress row is a blind append, which never conflicts.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)

log = logging.getLogger("walbridge.consumer")

T = TypeVar("T")

CONFLICTS: tuple[type[BaseException], ...] = (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
# The same conflicts when they reach Python wrapped in another error (a Py4J error, a task
# failure): Delta's class names and its error classes (DELTA_CONCURRENT_APPEND, ...).
_CONFLICT_TEXT = re.compile(
    r"io\.delta\.exceptions\.(Concurrent\w+|DeltaConcurrentModification|MetadataChanged|"
    r"ProtocolChanged)Exception|DELTA_CONCURRENT_\w+|DELTA_METADATA_CHANGED|"
    r"DELTA_PROTOCOL_CHANGED"
)

ATTEMPTS = 8
FIRST_WAIT_S = 0.2
MAX_WAIT_S = 10.0


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, CONFLICTS) or bool(_CONFLICT_TEXT.search(str(exc)))


def waits(attempts: int = ATTEMPTS) -> list[float]:
    """Seconds before each retry: doubling from FIRST_WAIT_S, capped at MAX_WAIT_S."""
    return [min(MAX_WAIT_S, FIRST_WAIT_S * 2**i) for i in range(attempts - 1)]


def retry_on_conflict(
    action: Callable[[], T],
    what: str,
    on_conflict: Callable[[], None] = lambda: None,
    attempts: int = ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`action()`, done again after a commit conflict (`on_conflict` first drops what the
    caller knew of the table, so the next attempt reads it anew), with backoff. Any other error,
    or a conflict on the last attempt, is raised as it is: the batch fails and is re-run."""
    for wait in [*waits(attempts), None]:
        try:
            return action()
        except Exception as exc:
            if wait is None or not is_conflict(exc):
                raise
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
            log.warning(
                "%s: concurrent commit to the table (%s); reading it again, retry in %.1fs",
                what,
                first_line,
                wait,
            )
            on_conflict()
            sleep(wait)
    raise AssertionError("unreachable")  # the last attempt returns or raises
