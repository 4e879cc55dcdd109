"""PostgreSQL, Kafka and the registry behind Toxiproxy proxies (no tests in this module).

PostgreSQL and the registry are the session stack's, each reached through a proxy of its own.
Kafka needs more: a broker tells a client which address to use after bootstrap (its advertised
listener), so a client that bootstraps through a proxy would then talk to the broker directly,
past every fault. Here a scratch broker (tests.support.scratch_stack) listens on a port of its
own and advertises the proxy's (deploy/local/stack's WALBRIDGE_KAFKA_ADVERTISED_PORT): every
connection, after bootstrap too, crosses the proxy. The broker's connections to itself (the
transaction coordinator writing markers to the partitions it leads) take the advertised
address as well, so a fault on the proxy reaches them too, as a real partition would.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from psycopg import conninfo

from tests.support.scratch_stack import ScratchStack, free_block
from tests.support.toxiproxy_client import Proxy, ToxiproxyApi


@dataclass(frozen=True)
class ProxiedStack:
    api: ToxiproxyApi
    pg: Proxy
    kafka: Proxy
    registry: Proxy
    pg_dsn: str  # through the proxy
    kafka_bootstrap: str  # through the proxy (the only address the broker gives out)
    registry_url: str  # through the proxy

    def heal(self) -> None:
        """Every proxy enabled and without toxics (between tests, after a failed one)."""
        self.api.reset()


@contextmanager
def proxied_stack(
    api: ToxiproxyApi, pg_dsn: str, registry_url: str, home: Path
) -> Iterator[ProxiedStack]:
    """Proxies for ``pg_dsn`` and ``registry_url`` and a scratch broker behind a third."""
    base = free_block(5)  # proxies: pg, registry, kafka; the broker and its controller
    pg_port, registry_port, kafka_port, broker_port = base, base + 1, base + 2, base + 3
    params = conninfo.conninfo_to_dict(pg_dsn)
    pg = api.create_proxy(
        "postgres", f"127.0.0.1:{pg_port}", f"{params.get('host', '127.0.0.1')}:{params['port']}"
    )
    url = urlsplit(registry_url)
    registry = api.create_proxy("registry", f"127.0.0.1:{registry_port}", url.netloc)
    kafka = api.create_proxy("kafka", f"127.0.0.1:{kafka_port}", f"127.0.0.1:{broker_port}")
    broker = ScratchStack(
        home,
        WALBRIDGE_KAFKA_PORT=str(broker_port),
        WALBRIDGE_KAFKA_CONTROLLER_PORT=str(base + 4),
        WALBRIDGE_KAFKA_ADVERTISED_PORT=str(kafka_port),
        WALBRIDGE_KAFKA_HEAP="512m",
    )
    try:
        broker.up("kafka")
        yield ProxiedStack(
            api=api,
            pg=pg,
            kafka=kafka,
            registry=registry,
            pg_dsn=conninfo.make_conninfo(pg_dsn, host="127.0.0.1", port=str(pg_port)),
            kafka_bootstrap=f"127.0.0.1:{kafka_port}",
            registry_url=urlunsplit(url._replace(netloc=f"127.0.0.1:{registry_port}")),
        )
    finally:
        broker.down()
        for proxy in (pg, registry, kafka):
            proxy.delete()
