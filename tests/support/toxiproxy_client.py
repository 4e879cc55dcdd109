"""A small client of Toxiproxy's HTTP API (no tests in this module).

Not ``toxiproxy-python`` from PyPI: its last release (0.1.1, January 2019) needs the ``future``
Python 2 shim and ``requests``, keeps the server's address in class attributes (one server per
process), sets no HTTP timeout (a stuck API call would hang the test instead of failing it) and
has no type hints. The calls we need are a handful of JSON requests, here over urllib.

API of Toxiproxy 2.x (the server deploy/local/install-toxiproxy builds): ``/proxies`` (create,
list), ``/proxies/<name>`` (update ``enabled``, delete), ``/proxies/<name>/toxics`` (add) and
``/proxies/<name>/toxics/<toxic>`` (remove), ``/reset`` (enable every proxy, remove all toxics).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

_API_TIMEOUT_S = 10.0
Stream = Literal["upstream", "downstream"]


class ToxiproxyError(RuntimeError):
    """The API refused a call (the status and the server's message say why)."""


class ToxiproxyApi:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://{self.host}:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=_API_TIMEOUT_S) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip()
            raise ToxiproxyError(f"{method} {path}: HTTP {exc.code}: {detail}") from exc
        return json.loads(raw) if raw.strip() else None

    def version(self) -> str:
        request = urllib.request.Request(f"http://{self.host}:{self.port}/version")
        with urllib.request.urlopen(request, timeout=_API_TIMEOUT_S) as response:
            return str(response.read().decode().strip())

    def create_proxy(self, name: str, listen: str, upstream: str) -> Proxy:
        self.call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream})
        return Proxy(self, name, listen, upstream)

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed (between tests)."""
        self.call("POST", "/reset")


@dataclass
class Proxy:
    """One TCP proxy: clients connect to ``listen``, the proxy connects to ``upstream``."""

    api: ToxiproxyApi
    name: str
    listen: str
    upstream: str

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def set_enabled(self, enabled: bool) -> None:
        """Disabled: every open connection is closed and new ones are refused (a partition)."""
        self.api.call("POST", f"/proxies/{self.name}", {"enabled": enabled})

    def add_toxic(
        self,
        name: str,
        kind: str,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
        **attributes: int,
    ) -> None:
        self.api.call(
            "POST",
            f"/proxies/{self.name}/toxics",
            {
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": toxicity,
                "attributes": attributes,
            },
        )

    def remove_toxic(self, name: str) -> None:
        self.api.call("DELETE", f"/proxies/{self.name}/toxics/{name}")

    def toxics(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api.call("GET", f"/proxies/{self.name}/toxics")
        return found

    @contextmanager
    def toxic(self, kind: str, stream: Stream = "downstream", **attributes: int) -> Iterator[None]:
        """A toxic for the duration of the ``with`` block."""
        name = f"{kind}_{stream}"
        self.add_toxic(name, kind, stream, **attributes)
        try:
            yield
        finally:
            self.remove_toxic(name)

    @contextmanager
    def partitioned(self) -> Iterator[None]:
        self.set_enabled(False)
        try:
            yield
        finally:
            self.set_enabled(True)

    def delete(self) -> None:
        self.api.call("DELETE", f"/proxies/{self.name}")
