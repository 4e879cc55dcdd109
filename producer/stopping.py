"""A clean stop: SIGTERM/SIGINT set a flag that every wait (Kafka, the registry, a slot held by
a fenced producer) and the stream loop check."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)


class ShutdownRequested(Exception):
    """SIGTERM/SIGINT noticed while blocked on Kafka or the registry, or inside a transaction."""


class StopFlag:
    def __init__(self) -> None:
        self.requested = False

    def request(self, signum: int, _frame: FrameType | None) -> None:
        log.info("stop requested", extra={"signal": signal.Signals(signum).name})
        self.requested = True

    def check(self) -> None:
        """Raise ShutdownRequested once a stop was asked for (called while waiting)."""
        if self.requested:
            raise ShutdownRequested()


def install_signal_handlers(stop: StopFlag) -> Callable[[], None]:
    previous = {s: signal.signal(s, stop.request) for s in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore
