"""Making sure the topics exist, through confluent-kafka's AdminClient (names: `schemas.topics`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from producer.errors import TopicError

log = logging.getLogger(__name__)

_ADMIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TopicPolicy:
    create: bool
    partitions: int
    replication_factor: int  # -1: broker default
    retention_ms: int  # 0: broker default


class ClientErrors:
    """librdkafka's error_cb: keeps the last error it reported. A refused login or TLS
    handshake reaches the caller only as "Broker transport failure"; this says why."""

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self, error: KafkaError) -> None:
        log.warning("Kafka admin client error", extra={"error": str(error)})
        # "all brokers are down" follows the error that says why; keep that one.
        if error.code() == KafkaError._ALL_BROKERS_DOWN and self.last is not None:
            return
        self.last = str(error)
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            # A listener that hangs up on the first request (plaintext to TLS) is reported
            # only as a disconnect in librdkafka's log, not as an error: point there.
            self.last += (
                ": no broker answered; check the bootstrap address, and that security.protocol "
                "in WALBRIDGE_KAFKA_CONFIG matches the listener (librdkafka's FAIL lines above)"
            )


class TopicManager:
    """Creates (or checks) each topic once per process, before its first event is produced."""

    def __init__(
        self, admin: AdminClient, policy: TopicPolicy, errors: ClientErrors | None = None
    ) -> None:
        self._admin = admin
        self._policy = policy
        self._errors = errors
        self._ready: set[str] = set()

    @classmethod
    def connect(cls, settings: dict[str, Any], policy: TopicPolicy) -> TopicManager:
        """An AdminClient with `settings` (librdkafka's), logging through `logging` (JSON)."""
        errors = ClientErrors()
        conf: dict[str, Any] = {
            **settings,
            "error_cb": errors,
            "logger": logging.getLogger("librdkafka"),
        }
        admin = AdminClient(conf)
        return cls(admin, policy, errors)

    def _metadata(self) -> dict[str, Any]:
        try:
            return dict(self._admin.list_topics(timeout=_ADMIN_TIMEOUT_S).topics)
        except KafkaException as exc:
            self._admin.poll(0)  # serves the error callbacks queued meanwhile
            reason = self._errors.last if self._errors is not None else None
            if reason is None:
                raise
            raise KafkaException(
                KafkaError(exc.args[0].code(), f"{exc.args[0].str()}; the client said: {reason}")
            ) from exc

    def ensure(
        self,
        topics: list[str],
        *,
        single_partition: bool = False,
        config: dict[str, str] | None = None,
    ) -> None:
        """``single_partition``: the transaction topic. Its END markers must be totally ordered,
        so a consumer that sees a transaction's END has seen every earlier transaction's END.
        ``config``: topic settings for topics created here (on top of the policy's)."""
        wanted = [t for t in dict.fromkeys(topics) if t not in self._ready]
        if not wanted:
            return
        metadata = self._metadata()
        existing = set(metadata)
        if single_partition:
            for topic in wanted:
                if topic in existing and len(metadata[topic].partitions) != 1:
                    raise TopicError(
                        topic,
                        f"has {len(metadata[topic].partitions)} partitions; the transaction topic "
                        "must have exactly one, so that transaction markers stay in commit order",
                    )
        missing = [t for t in wanted if t not in existing]
        if missing and not self._policy.create:
            raise TopicError(
                missing[0],
                "does not exist and topic creation is off (--no-create-topics / "
                f"WALBRIDGE_CREATE_TOPICS=false); create it first. Missing: {', '.join(missing)}",
            )
        if missing:
            self._create(missing, 1 if single_partition else self._policy.partitions, config)
        self._ready.update(wanted)

    def _create(
        self, topics: list[str], partitions: int, extra: dict[str, str] | None = None
    ) -> None:
        config = dict(extra or {})
        if self._policy.retention_ms and "cleanup.policy" not in config:
            config["retention.ms"] = str(self._policy.retention_ms)
        new = [
            NewTopic(
                t,
                num_partitions=partitions,
                replication_factor=self._policy.replication_factor,
                config=config,
            )
            for t in topics
        ]
        for topic, future in self._admin.create_topics(
            new, request_timeout=_ADMIN_TIMEOUT_S
        ).items():
            try:
                future.result()
            except KafkaException as exc:
                error = exc.args[0]
                if (
                    isinstance(error, KafkaError)
                    and error.code() == KafkaError.TOPIC_ALREADY_EXISTS
                ):
                    continue  # created concurrently: fine
                raise TopicError(topic, f"could not be created: {exc}") from exc
            log.info("created topic", extra={"topic": topic, "partitions": partitions})
