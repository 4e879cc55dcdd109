"""session_conf.changed: the setting is put back as it was, after an error too."""

from __future__ import annotations

from typing import Any, cast

import pytest

from spark_consumer import session_conf

pytestmark = pytest.mark.unit


class FakeConf:
    def __init__(self, **values: str) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class FakeSpark:
    def __init__(self, **values: str) -> None:
        self.conf = FakeConf(**values)


def test_a_setting_that_was_unset_is_unset_again() -> None:
    spark = FakeSpark()
    with session_conf.changed(cast(Any, spark), "k", "false"):
        assert spark.conf.values == {"k": "false"}
    assert spark.conf.values == {}


def test_a_setting_that_was_set_gets_its_value_back_after_an_error() -> None:
    spark = FakeSpark(k="true", other="x")
    with pytest.raises(RuntimeError), session_conf.changed(cast(Any, spark), "k", "false"):
        assert spark.conf.values["k"] == "false"
        raise RuntimeError("a MERGE failed")
    assert spark.conf.values == {"k": "true", "other": "x"}
