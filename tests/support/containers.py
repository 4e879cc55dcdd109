"""Build and run walbridge's images with podman for the tests (no tests in this module).

The images are built by deploy/container/build (buildah, vfs storage, chroot isolation) from the
base it makes from Debian packages: public base images can't be pulled on the machines the tests
run on. Both tools share the image store under $WALBRIDGE_HOME/containers.
"""

from __future__ import annotations

import functools
import hashlib
import os
import resource
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "container" / "build"


def store() -> Path:
    home = Path(os.environ.get("WALBRIDGE_HOME", str(ROOT / ".walbridge"))).resolve()
    return home / "containers"


def runroot(store_path: Path) -> str:
    """The run root deploy/container/build uses for this store: a short path under /tmp
    (podman refuses one longer than 50 characters), named after the resolved store path."""
    digest = hashlib.sha1(str(store_path).encode()).hexdigest()[:12]
    return f"/tmp/walbridge-{digest}"


def podman(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`podman` on the build script's image store; the caller checks the exit status."""
    root = store()
    command = [
        "podman", "--root", str(root / "storage"), "--runroot", runroot(root),
        "--storage-driver", "vfs", *args,
    ]  # fmt: skip
    return subprocess.run(command, env=env, text=True, capture_output=True, timeout=timeout)


def run_options() -> list[str]:
    """`podman run` options this kind of machine needs, each for a reason podman reported here.

    - runc, not crun: crun 1.8 (Debian 12) refuses a host with cgroups v1 and v2 mounted together
      ("cgroups in hybrid mode not supported").
    - The open-files limit at the machine's own hard limit and a process limit of 4096: podman's
      defaults (1048576 open files and processes) are above what this machine allows, and
      setrlimit fails ("Operation not permitted"); so did a process limit at our own hard limit.
    - The image's HEALTHCHECK is run by `podman healthcheck run` in the tests: podman's own timer
      needs systemd, which this machine does not run.
    """
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = 4096  # the producer runs a handful of threads
    return [
        "--runtime", "runc", "--ulimit", f"nofile={nofile}:{nofile}",
        "--ulimit", f"nproc={nproc}:{nproc}", "--health-interval", "disable",
    ]  # fmt: skip


@functools.cache
def build_image(name: str) -> str:
    """Build `localhost/walbridge-<name>` once per test session (from the checkout as it is then;
    installs buildah, podman and debootstrap if missing)."""
    proc = subprocess.run(
        [str(BUILD), "--base", "debian", name], text=True, capture_output=True, timeout=3600
    )
    if proc.returncode != 0:
        pytest.fail(f"deploy/container/build {name} failed:\n{proc.stderr[-4000:]}", pytrace=False)
    return f"localhost/walbridge-{name}:latest"


def run_detached(
    image: str, name: str, settings: dict[str, str], *args: str, mounts: tuple[str, ...] = ()
) -> None:
    """`podman run --detach` on the host's network (the stack listens on loopback only).

    Settings travel in podman's environment (`--env NAME`), so no DSN is on a command line.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("WALBRIDGE_")} | settings
    env_args = [arg for key in settings for arg in ("--env", key)]
    volume_args = [arg for mount in mounts for arg in ("--volume", mount)]
    started = podman(
        "run", "--detach", "--name", name, "--network", "host", *run_options(), *env_args,
        *volume_args, image, *args, env=env,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr


def wait_exit(name: str, timeout: float) -> int:
    """The container's exit status (`podman wait`), failing with its log after `timeout`."""
    waited = podman("wait", name, timeout=timeout + 30)
    assert waited.returncode == 0, waited.stderr + logs(name)
    return int(waited.stdout.strip().splitlines()[-1])


def logs(name: str) -> str:
    out = podman("logs", name)
    return (out.stdout + out.stderr)[-6000:]


def wait_ready(name: str, port: int, timeout: float = 120.0) -> None:
    """Until the producer container answers 200 on /readyz (the slot exists and it streams)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        assert state == "running", logs(name)
        assert time.monotonic() < deadline, logs(name)
        time.sleep(0.5)
