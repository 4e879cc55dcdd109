"""Reading a compacted state topic (schemas.compacted) while its partition's leader does not know
the topic yet (mocked consumer; no services)."""

from __future__ import annotations

from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from schemas.compacted import read_latest

pytestmark = pytest.mark.unit


class _Metadata:
    def __init__(self, topic: str) -> None:
        self.topics = {topic: object()}


class _Consumer:
    """A consumer of an empty topic whose leader answers ``errors`` first."""

    def __init__(self, errors: list[int]) -> None:
        self.errors = list(errors)
        self.asked = 0
        self.closed = False

    def __call__(self, _conf: dict[str, Any]) -> _Consumer:
        return self

    def list_topics(self, timeout: float) -> _Metadata:
        return _Metadata("p.snapshot")

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        self.asked += 1
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return 0, 0

    def close(self) -> None:
        self.closed = True


def test_a_topic_its_leader_does_not_know_yet_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = _Consumer([KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE])
    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    assert read_latest({"bootstrap.servers": "x"}, "p.snapshot", timeout_s=5) == {}
    assert consumer.asked == 3
    assert consumer.closed


def test_it_gives_up_naming_the_topic_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer([KafkaError.UNKNOWN_TOPIC_OR_PART] * 100)
    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    with pytest.raises(TimeoutError, match=r"'p\.snapshot' partition 0: not ready after 0s"):
        read_latest({"bootstrap.servers": "x"}, "p.snapshot", timeout_s=0.3)


def test_other_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = _Consumer([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    with pytest.raises(KafkaException):
        read_latest({"bootstrap.servers": "x"}, "p.snapshot", timeout_s=5)
    assert consumer.asked == 1
