"""Making sure the topics exist, through confluent-kafka's AdminClient (names: `schemas.topics`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

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


class TopicManager:
    """Creates (or checks) each topic once per process, before its first event is produced."""

    def __init__(self, admin: AdminClient, policy: TopicPolicy) -> None:
        self._admin = admin
        self._policy = policy
        self._ready: set[str] = set()

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
        metadata = self._admin.list_topics(timeout=_ADMIN_TIMEOUT_S).topics
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
