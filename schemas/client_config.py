"""Client settings for secured services, shared by the producer and the consumer.

`WALBRIDGE_KAFKA_CONFIG` holds librdkafka settings and `WALBRIDGE_SCHEMA_REGISTRY_CONFIG`
confluent-kafka `SchemaRegistryClient` settings, both as `k=v,k=v`. Secrets may instead come
from files (`WALBRIDGE_<NAME>_FILE`, as Kubernetes mounts them). The consumer's Kafka source is
Spark's, which speaks the Java client's settings: `java_kafka_options` translates.

Errors name keys and variables, never values: a value may be a password.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final

# The settings that may hold a secret, each readable from WALBRIDGE_<NAME>_FILE instead.
SECRET_SETTINGS: Final = (
    "WALBRIDGE_PG_DSN",
    "WALBRIDGE_KAFKA_CONFIG",
    "WALBRIDGE_SCHEMA_REGISTRY_CONFIG",
)
SECRET_FILES: Final = frozenset(f"{name}_FILE" for name in SECRET_SETTINGS)


class ClientConfigError(ValueError):
    """A bad client setting; the message names the variable or key, never a value."""


def with_secret_files(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with each WALBRIDGE_<NAME>_FILE replaced by WALBRIDGE_<NAME> read from that file
    (one trailing newline dropped). Setting both is an error: which one is meant is a guess."""
    out = dict(env)
    for name in SECRET_SETTINGS:
        path = out.pop(f"{name}_FILE", "")
        if not path:
            continue
        if out.get(name):
            raise ClientConfigError(f"{name} and {name}_FILE are both set; set one")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ClientConfigError(
                f"{name}_FILE: can't read {path!r} ({exc.strerror or exc})"
            ) from None
        out[name] = text[:-1] if text.endswith("\n") else text
    return out


def parse_pairs(text: str, what: str) -> dict[str, str]:
    """`k=v,k=v` into a dict; `what` names the setting in errors."""
    pairs: dict[str, str] = {}
    for number, item in enumerate((part.strip() for part in text.split(",")), 1):
        if not item:
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            # Its position, not its text: a comma inside a password splits it into such items.
            raise ClientConfigError(f"{what}: item {number} is not key=value")
        if key in pairs:
            raise ClientConfigError(f"{what}: {key!r} is set twice")
        pairs[key] = value.strip()
    return pairs


# SchemaRegistryClient settings a deployment may set (the URL and retries are ours): those
# confluent-kafka 2.16's client accepts, checked here so a typo fails before any I/O.
REGISTRY_KEYS: Final = frozenset(
    {
        "basic.auth.user.info", "ssl.ca.location", "ssl.certificate.location",
        "ssl.key.location", "ssl.key.password", "proxy", "timeout", "cache.capacity",
        "cache.latest.ttl.sec", "bearer.auth.credentials.source", "bearer.auth.token",
        "bearer.auth.logical.cluster", "bearer.auth.identity.pool.id",
        "bearer.auth.issuer.endpoint.url", "bearer.auth.client.id", "bearer.auth.client.secret",
        "bearer.auth.scope",
    }
)  # fmt: skip


def registry_client_config(text: str) -> dict[str, str | int]:
    """WALBRIDGE_SCHEMA_REGISTRY_CONFIG as SchemaRegistryClient settings (fails on unknown keys
    at start-up, not at the first registry call)."""
    pairs = parse_pairs(text, "WALBRIDGE_SCHEMA_REGISTRY_CONFIG")
    unknown = sorted(set(pairs) - REGISTRY_KEYS)
    if unknown:
        raise ClientConfigError(
            f"WALBRIDGE_SCHEMA_REGISTRY_CONFIG: unknown key(s) {unknown}; "
            f"known: {sorted(REGISTRY_KEYS)}"
        )
    out: dict[str, str | int] = dict(pairs)
    for key in ("timeout", "cache.capacity", "cache.latest.ttl.sec"):
        if key in pairs:
            try:
                out[key] = int(pairs[key])
            except ValueError:
                raise ClientConfigError(
                    f"WALBRIDGE_SCHEMA_REGISTRY_CONFIG: {key} must be an integer"
                ) from None
    return out


_SASL_LOGIN_MODULES: Final = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# librdkafka keys whose Java client key is the same, with the same values.
_SAME_IN_JAVA: Final = frozenset({"security.protocol", "client.id", "ssl.key.password"})


def _jaas_quote(value: str) -> str:
    # JAAS option values are double-quoted strings with backslash escapes.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_kafka_options(librdkafka: Mapping[str, str]) -> dict[str, str]:
    """librdkafka security settings as the Java client's, for Spark's `kafka.*` options.

    Covers TLS (a CA file, optionally a client certificate) and SASL PLAIN/SCRAM with a user
    name and password; any other key is an error naming it, so a setting is never dropped."""
    conf = dict(librdkafka)
    out: dict[str, str] = {}
    for same in _SAME_IN_JAVA & set(conf):
        out[same] = conf.pop(same)
    mechanism = conf.pop("sasl.mechanisms", None) or conf.pop("sasl.mechanism", None)
    username = conf.pop("sasl.username", None)
    password = conf.pop("sasl.password", None)
    if mechanism is not None:
        module = _SASL_LOGIN_MODULES.get(mechanism.upper())
        if module is None:
            raise ClientConfigError(
                f"WALBRIDGE_KAFKA_CONFIG: sasl.mechanisms {mechanism!r} is not supported by the "
                f"consumer (one of {sorted(_SASL_LOGIN_MODULES)})"
            )
        if username is None or password is None:
            raise ClientConfigError(
                "WALBRIDGE_KAFKA_CONFIG: sasl.mechanisms needs sasl.username and sasl.password"
            )
        out["sasl.mechanism"] = mechanism.upper()
        out["sasl.jaas.config"] = (
            f"{module} required username={_jaas_quote(username)} password={_jaas_quote(password)};"
        )
    elif username is not None or password is not None:
        raise ClientConfigError(
            "WALBRIDGE_KAFKA_CONFIG: sasl.username/password need sasl.mechanisms"
        )
    ca = conf.pop("ssl.ca.location", None)
    if ca is not None:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = ca
    cert = conf.pop("ssl.certificate.location", None)
    key = conf.pop("ssl.key.location", None)
    if (cert is None) != (key is None):
        raise ClientConfigError(
            "WALBRIDGE_KAFKA_CONFIG: ssl.certificate.location and ssl.key.location go together"
        )
    if cert is not None and key is not None:
        # Java's PEM key store takes the certificate chain and the key as text, not paths.
        out["ssl.keystore.type"] = "PEM"
        out["ssl.keystore.certificate.chain"] = _read_pem(cert, "ssl.certificate.location")
        out["ssl.keystore.key"] = _read_pem(key, "ssl.key.location")
    algorithm = conf.pop("ssl.endpoint.identification.algorithm", None)
    if algorithm is not None:
        if algorithm not in ("none", "https"):
            raise ClientConfigError(
                "WALBRIDGE_KAFKA_CONFIG: ssl.endpoint.identification.algorithm must be none or https"
            )
        out["ssl.endpoint.identification.algorithm"] = "" if algorithm == "none" else "https"
    if conf:
        raise ClientConfigError(
            f"WALBRIDGE_KAFKA_CONFIG: the consumer can't pass {sorted(conf)} to Spark's Kafka "
            "source (it translates security.protocol, sasl.mechanisms/username/password, "
            "ssl.ca.location, ssl.certificate.location/key.location/key.password, "
            "ssl.endpoint.identification.algorithm and client.id)"
        )
    return out


def _read_pem(path: str, key: str) -> str:
    try:
        return Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeError) as exc:
        raise ClientConfigError(f"WALBRIDGE_KAFKA_CONFIG: {key}: can't read {path!r}") from exc
