"""One Toxiproxy server for a test session (no tests in this module).

The binary is built on demand by deploy/local/install-toxiproxy (once per download cache, deploy/local/lib/download-cache.sh), so
a fresh machine's test command works without a separate install step. The API listens on a
free port of the helper's range (tests.support.scratch_stack.free_block), on loopback only.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.scratch_stack import free_block
from tests.support.toxiproxy_client import ToxiproxyApi

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "deploy" / "local" / "install-toxiproxy"
_START_TIMEOUT_S = 20.0


def toxiproxy_binary() -> str:
    proc = subprocess.run([str(INSTALL)], text=True, capture_output=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"deploy/local/install-toxiproxy failed:\n{proc.stderr}")
    return proc.stdout.strip()


@contextmanager
def toxiproxy_server(log_dir: Path) -> Iterator[ToxiproxyApi]:
    binary = toxiproxy_binary()
    port = free_block(1)
    log_path = log_dir / "toxiproxy.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [binary, "-host", "127.0.0.1", "-port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    api = ToxiproxyApi("127.0.0.1", port)
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            try:
                api.version()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"toxiproxy did not start on port {port}:\n{log_path.read_text()[-2000:]}"
                    ) from None
                time.sleep(0.1)
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
