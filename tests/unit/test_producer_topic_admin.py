"""TopicManager: partitions per topic kind, and the transaction topic's single partition."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from producer.errors import TopicError
from producer.topic_admin import TopicManager, TopicPolicy


class FakeAdmin:
    def __init__(self, existing: dict[str, int]) -> None:
        self.existing = existing  # topic -> partition count
        self.created: dict[str, int] = {}

    def list_topics(self, timeout: float) -> Any:
        topics = {
            t: SimpleNamespace(partitions=dict.fromkeys(range(n))) for t, n in self.existing.items()
        }
        return SimpleNamespace(topics=topics)

    def create_topics(self, new: list[Any], request_timeout: float) -> dict[str, Future[None]]:
        futures: dict[str, Future[None]] = {}
        for topic in new:
            self.created[topic.topic] = topic.num_partitions
            futures[topic.topic] = Future()
            futures[topic.topic].set_result(None)
        return futures


POLICY = TopicPolicy(create=True, partitions=3, replication_factor=1, retention_ms=0)


def test_transaction_topic_is_created_with_one_partition_data_topics_with_the_policy() -> None:
    admin = FakeAdmin({})
    manager = TopicManager(admin, POLICY)  # type: ignore[arg-type]
    manager.ensure(["p.transaction"], single_partition=True)
    manager.ensure(["p.public.t", "p.heartbeat"])
    assert admin.created == {"p.transaction": 1, "p.public.t": 3, "p.heartbeat": 3}


def test_existing_transaction_topic_with_several_partitions_is_refused() -> None:
    manager = TopicManager(FakeAdmin({"p.transaction": 3}), POLICY)  # type: ignore[arg-type]
    with pytest.raises(TopicError, match=r"p\.transaction.*3 partitions.*exactly one"):
        manager.ensure(["p.transaction"], single_partition=True)


def test_missing_topic_with_creation_off_names_it() -> None:
    manager = TopicManager(FakeAdmin({}), TopicPolicy(False, 3, 1, 0))  # type: ignore[arg-type]
    with pytest.raises(TopicError, match=r"p\.public\.t"):
        manager.ensure(["p.public.t"])
