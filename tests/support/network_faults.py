"""The network faults, by name, as Toxiproxy toxics on one proxy (no tests in this module).

One vocabulary for the integration tests and, later, the torture run (issue 41, item 3): each
fault is a context manager that holds the fault on a proxy for as long as the block runs.

- ``latency``: every chunk both ways delayed by 300 ms +- 150 ms (jitter);
- ``bandwidth``: 32 KB/s each way;
- ``reset``: connections reset (TCP RST, unsent data discarded) as soon as data passes, new
  ones too, for as long as the fault lasts: a reset in the middle of the stream;
- ``silent``: a half-open connection: nothing passes either way and nothing is closed (the
  ``timeout`` toxic with timeout 0). Toxiproxy 2.5 drops what it holds and closes the
  connections when the toxic is removed, so the client must notice the silence itself before;
- ``partition``: the proxy disabled: open connections closed, new ones refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Final

from tests.support.toxiproxy_client import Proxy

FAULTS: Final = ("latency", "bandwidth", "reset", "silent", "partition")
LATENCY_MS: Final = 300
JITTER_MS: Final = 150
BANDWIDTH_KB_S: Final = 32


@contextmanager
def fault(proxy: Proxy, kind: str) -> Iterator[None]:
    if kind not in FAULTS:
        raise ValueError(f"unknown network fault {kind!r}; known: {', '.join(FAULTS)}")
    if kind == "partition":
        with proxy.partitioned():
            yield
        return
    with ExitStack() as stack:
        for stream in ("downstream", "upstream"):
            if kind == "latency":
                stack.enter_context(
                    proxy.toxic("latency", stream, latency=LATENCY_MS, jitter=JITTER_MS)
                )
            elif kind == "bandwidth":
                stack.enter_context(proxy.toxic("bandwidth", stream, rate=BANDWIDTH_KB_S))
            elif kind == "reset":
                stack.enter_context(proxy.toxic("reset_peer", stream, timeout=0))
            else:
                stack.enter_context(proxy.toxic("timeout", stream, timeout=0))
        yield
