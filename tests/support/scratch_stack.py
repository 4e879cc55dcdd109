"""A second local stack in a throw-away state directory (no tests in this module).

Tests that need services the session stack does not run (three Kafka brokers, the secure stack)
start them here, on free ports, with the session's download cache, and stop them afterwards.
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
from pathlib import Path

from tests.conftest import STACK


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_block(size: int) -> int:
    """The first of `size` consecutive free ports (the stack numbers extra brokers from a base).

    Inside a helper's range when WALBRIDGE_HELPER_PORT_BASE is set, else a random high range."""
    base = os.environ.get("WALBRIDGE_HELPER_PORT_BASE")
    candidates = (
        range(int(base) + 10, int(base) + 100 - size)
        if base
        else [random.randrange(40000, 50000) for _ in range(200)]
    )
    for first in candidates:
        if all(port_free(first + i) for i in range(size)):
            return first
    raise RuntimeError(f"no {size} consecutive free ports")


def download_cache() -> Path:
    """deploy/local/stack's download cache: $WALBRIDGE_DOWNLOADS, else the user's cache directory
    (shared by every clone and state directory, so a scratch stack downloads nothing twice)."""
    if cache := os.environ.get("WALBRIDGE_DOWNLOADS"):
        return Path(cache)
    if os.getuid() == 0:  # PostgreSQL runs as `postgres` then: root's home is closed to it
        return Path("/var/cache/walbridge")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "walbridge"


def session_venv() -> Path:
    """The test command's virtualenv (deploy/local/lib/python-env.sh: $WALBRIDGE_HOME/venv)."""
    home = Path(
        os.environ.get("WALBRIDGE_HOME") or Path(__file__).resolve().parents[2] / ".walbridge"
    )
    return home / "venv"


class ScratchStack:
    def __init__(self, home: Path, **settings: str) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")}
        self.env.update(
            WALBRIDGE_HOME=str(home), WALBRIDGE_DOWNLOADS=str(download_cache()), **settings
        )
        # `stack up` runs the project's Python for some steps (the secure stack's Kafka ACLs,
        # the Spark workers' distribution) from $WALBRIDGE_HOME/venv, and installs one there if
        # there is none: a whole `pip install -e .[dev]` per scratch stack, over a minute of the
        # secure stack's start here. The session's own venv, installed from the same
        # pyproject.toml (python-env.sh checks its stamp), serves instead.
        venv, link = session_venv(), home / "venv"
        if (venv / ".walbridge-installed").is_file() and not link.exists():
            home.mkdir(parents=True, exist_ok=True)
            link.symlink_to(venv.resolve(), target_is_directory=True)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(STACK), *args], env=self.env, text=True, capture_output=True, timeout=timeout
        )

    def up(self, *services: str) -> None:
        proc = self.run("up", *services)
        if proc.returncode != 0:
            raise AssertionError(f"stack up {' '.join(services)} failed:\n{proc.stderr}")

    def down(self) -> None:
        self.run("down")

    def exports(self, *args: str) -> dict[str, str]:
        out = self.run("env", *args).stdout
        return dict(re.findall(r"^export (\w+)='([^']*)'$", out, re.MULTILINE))

    def pid(self, service: str) -> int:
        # `stack up` keeps state under <home>, or <home>/secure for the secure stack.
        for run_dir in (self.home / "run", self.home / "secure" / "run"):
            path = run_dir / f"{service}.pid"
            if path.exists():
                return int(path.read_text().split()[0])
        raise AssertionError(f"no pid file for {service} under {self.home}")
