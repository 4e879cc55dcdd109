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
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from psycopg import conninfo

from tests.support import network_faults
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


def postgres_proxy(api: ToxiproxyApi, name: str, pg_dsn: str, port: int) -> tuple[Proxy, str]:
    """A proxy on ``port`` in front of ``pg_dsn``'s server, and the DSN through it."""
    params = conninfo.conninfo_to_dict(pg_dsn)
    proxy = api.create_proxy(
        name, f"127.0.0.1:{port}", f"{params.get('host', '127.0.0.1')}:{params['port']}"
    )
    return proxy, conninfo.make_conninfo(pg_dsn, host="127.0.0.1", port=str(port))


def registry_proxy(api: ToxiproxyApi, name: str, url: str, port: int) -> tuple[Proxy, str]:
    """A proxy on ``port`` in front of the registry at ``url``, and the URL through it."""
    parts = urlsplit(url)
    proxy = api.create_proxy(name, f"127.0.0.1:{port}", parts.netloc)
    return proxy, urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))


@contextmanager
def proxied_stack(
    api: ToxiproxyApi, pg_dsn: str, registry_url: str, home: Path
) -> Iterator[ProxiedStack]:
    """Proxies for ``pg_dsn`` and ``registry_url`` and a scratch broker behind a third."""
    base = free_block(5)  # proxies: pg, registry, kafka; the broker and its controller
    pg_port, registry_port, kafka_port, broker_port = base, base + 1, base + 2, base + 3
    pg, proxied_dsn = postgres_proxy(api, "postgres", pg_dsn, pg_port)
    registry, proxied_url = registry_proxy(api, "registry", registry_url, registry_port)
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
            pg_dsn=proxied_dsn,
            kafka_bootstrap=f"127.0.0.1:{kafka_port}",
            registry_url=proxied_url,
        )
    finally:
        broker.down()
        for proxy in (pg, registry, kafka):
            proxy.delete()


# -- the torture run's links: the local stack's own services behind proxies ---------------------

# Per broker, deploy/local/stack's WALBRIDGE_KAFKA_PROXIED_PORT gives two extra listeners, for
# the producer (k=0) and the consumer (k=1): broker i's listener k listens on
# base + 4(i-1) + 2k + 1 and advertises base + 4(i-1) + 2k, where its proxy listens.
KAFKA_PORTS_PER_BROKER = 4


def kafka_proxied_ports(base: int, node: int, k: int) -> tuple[int, int]:
    """(the proxy's port, the broker's listener port) of broker ``node``'s proxied listener k."""
    proxy = base + KAFKA_PORTS_PER_BROKER * (node - 1) + 2 * k
    return proxy, proxy + 1


@dataclass(frozen=True)
class TortureLinks:
    """Toxiproxy between each client and server of the torture run: the producer and PostgreSQL,
    the producer and the registry, the producer and every broker, the consumer and every broker
    (names as in torture_checks.LINKS). The addresses are the clients' (through the proxies)."""

    api: ToxiproxyApi
    proxies: dict[str, list[Proxy]]
    producer_pg_dsn: str
    producer_registry_url: str
    producer_kafka_bootstrap: str
    consumer_kafka_bootstrap: str

    @contextmanager
    def fault(self, kind: str, link: str) -> Iterator[None]:
        """The network fault ``kind`` (network_faults.FAULTS) on every proxy of ``link``."""
        if link not in self.proxies:
            raise ValueError(f"unknown link {link!r}; known: {', '.join(self.proxies)}")
        with ExitStack() as stack:
            for proxy in self.proxies[link]:
                stack.enter_context(network_faults.fault(proxy, kind))
            yield

    def heal(self) -> None:
        self.api.reset()


@contextmanager
def torture_links(
    api: ToxiproxyApi, pg_dsn: str, registry_url: str, kafka_base: int, brokers: int
) -> Iterator[TortureLinks]:
    """The proxies of the torture run. The brokers must already have the proxied listeners of
    ``kafka_base`` (deploy/local/stack with WALBRIDGE_KAFKA_PROXIED_PORT=kafka_base)."""
    created: list[Proxy] = []
    try:
        kafka: dict[str, list[Proxy]] = {"producer_kafka": [], "consumer_kafka": []}
        for node in range(1, brokers + 1):
            for k, link in enumerate(kafka):
                proxy_port, listener = kafka_proxied_ports(kafka_base, node, k)
                proxy = api.create_proxy(
                    f"{link}_{node}", f"127.0.0.1:{proxy_port}", f"127.0.0.1:{listener}"
                )
                created.append(proxy)
                kafka[link].append(proxy)
        base = free_block(2)  # after the Kafka proxies took their ports
        pg, dsn = postgres_proxy(api, "producer_postgres", pg_dsn, base)
        created.append(pg)
        registry, url = registry_proxy(api, "producer_registry", registry_url, base + 1)
        created.append(registry)

        def bootstrap(link: str) -> str:
            return ",".join(p.listen for p in kafka[link])

        yield TortureLinks(
            api=api,
            proxies={"producer_postgres": [pg], "producer_registry": [registry], **kafka},
            producer_pg_dsn=dsn,
            producer_registry_url=url,
            producer_kafka_bootstrap=bootstrap("producer_kafka"),
            consumer_kafka_bootstrap=bootstrap("consumer_kafka"),
        )
    finally:
        for proxy in created:
            proxy.delete()
