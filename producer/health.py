"""HTTP endpoint: /healthz (the loop is alive), /readyz (streaming and delivering), /metrics.

A small ``http.server`` on a daemon thread: prometheus_client's own server only serves
/metrics, and the probes need the producer's state as well.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

POSTGRES = "PostgreSQL"  # the replication connection, in /readyz's "degraded: ..." reason


class HealthState:
    """Written by the producer loop, read by the HTTP thread (plain attribute writes are atomic)."""

    def __init__(self, stall_after_s: float) -> None:
        self.stall_after_s = stall_after_s
        self.last_progress = time.monotonic()
        self.streaming = False
        self.degraded: str | None = None  # why not ready (broker down, registry retrying, ...)
        self.stopped: str | None = None
        self.activity = ""  # shown by /readyz when ready, e.g. "snapshotting public.orders"

    def progress(self) -> None:
        self.last_progress = time.monotonic()

    def unreachable(self, dependency: str, detail: str) -> None:
        """A dependency is being retried with backoff: /readyz says "degraded" and why, while
        /healthz stays up (waiting for a server to come back is not a hang)."""
        self.degraded = f"{dependency} unreachable: {detail}"
        self.progress()

    def reachable(self, dependency: str) -> None:
        """``dependency`` answered again; another dependency's outage stays reported."""
        if self.degraded is not None and self.degraded.startswith(f"{dependency} unreachable"):
            self.degraded = None

    def alive(self) -> tuple[bool, str]:
        if self.stopped is not None:
            return False, f"stopped: {self.stopped}"
        age = time.monotonic() - self.last_progress
        if age > self.stall_after_s:
            return False, f"loop made no progress for {age:.0f}s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        alive, why = self.alive()
        if not alive:
            return False, why
        if not self.streaming:
            return False, "not streaming yet"
        if self.degraded is not None:
            return False, f"degraded: {self.degraded}"
        return True, f"ok: {self.activity}" if self.activity else "ok"


class HealthServer:
    def __init__(
        self, host: str, port: int, state: HealthState, registry: CollectorRegistry
    ) -> None:
        handler = _handler(state, registry)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="walbridge-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(state: HealthState, registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif self.path in ("/healthz", "/readyz"):
                ok, why = state.alive() if self.path == "/healthz" else state.ready()
                self._send(200 if ok else 503, why.encode() + b"\n", "text/plain")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would flood the structured log

    return Handler
