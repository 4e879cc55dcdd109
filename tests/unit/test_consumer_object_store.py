"""spark_consumer.object_store: s3a settings come from the standard AWS variables alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_consumer import object_store
from spark_consumer.config import SparkSettings
from spark_consumer.errors import ConfigError

pytestmark = pytest.mark.unit


def test_s3a_is_used_for_s3a_paths_or_an_endpoint() -> None:
    assert not object_store.uses_s3a({"WALBRIDGE_LAKE_PATH": "/data/lake"})
    assert object_store.uses_s3a({"WALBRIDGE_LAKE_PATH": "s3a://b/lake"})
    assert object_store.uses_s3a({"WALBRIDGE_CHECKPOINT_PATH": "s3a://b/cp"})
    assert object_store.uses_s3a({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    assert object_store.uses_s3a({}, ["s3a://b/lake"])


def test_a_compatible_store_gets_its_endpoint_path_style_and_keys() -> None:
    conf = object_store.s3a_conf(
        {
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_ACCESS_KEY_ID": "id",
            "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_REGION": "eu-west-1",
        }
    )
    assert conf == {
        "spark.sql.streaming.checkpointFileManagerClass": (
            "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
        ),
        "spark.hadoop.fs.s3a.connection.timeout": "60000ms",
        "spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.performance.flags": "mkdir,create",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.access.key": "id",
        "spark.hadoop.fs.s3a.secret.key": "secret",
        "spark.hadoop.fs.s3a.aws.credentials.provider": (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        ),
    }


def test_aws_itself_keeps_hadoops_defaults_and_session_tokens_are_temporary_credentials() -> None:
    conf = object_store.s3a_conf(
        {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"}
    )
    assert "spark.hadoop.fs.s3a.endpoint" not in conf
    assert "spark.hadoop.fs.s3a.performance.flags" not in conf
    assert conf["spark.hadoop.fs.s3a.session.token"] == "t"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"].endswith(
        "TemporaryAWSCredentialsProvider"
    )
    # No keys: S3A's own default credential providers decide; only the silence bound is ours.
    assert [key for key in object_store.s3a_conf({}) if "s3a" in key] == [
        "spark.hadoop.fs.s3a.connection.timeout"
    ]


def test_a_silent_connection_is_dropped_after_the_stated_timeout() -> None:
    assert object_store.s3a_conf({}, 7.5)["spark.hadoop.fs.s3a.connection.timeout"] == "7500ms"


def test_hadoop_aws_follows_the_hadoop_client_spark_ships(tmp_path: Path) -> None:
    (tmp_path / "hadoop-client-api-3.4.1.jar").touch()
    (tmp_path / "hadoop-client-runtime-3.4.1.jar").touch()
    assert object_store.hadoop_version(tmp_path) == "3.4.1"
    assert object_store.s3a_package("3.4.1") == "org.apache.hadoop:hadoop-aws:3.4.1"
    assert not object_store.ships_s3a(tmp_path)
    (tmp_path / "org.apache.hadoop_hadoop-aws-3.4.1.jar").touch()
    assert object_store.ships_s3a(tmp_path)
    with pytest.raises(RuntimeError, match="hadoop-client-api"):
        object_store.hadoop_version(tmp_path / "missing")


def test_the_object_store_timeout_is_a_setting_with_s3as_floor() -> None:
    assert SparkSettings.from_env({}).object_store_timeout_s == 60.0
    env = {"WALBRIDGE_OBJECT_STORE_TIMEOUT_S": "20"}
    assert SparkSettings.from_env(env).object_store_timeout_s == 20.0
    # S3A would raise a lower value to 15 s without a word: refused here, naming the setting.
    with pytest.raises(ConfigError, match="WALBRIDGE_OBJECT_STORE_TIMEOUT_S must be at least 15"):
        SparkSettings.from_env({"WALBRIDGE_OBJECT_STORE_TIMEOUT_S": "8"})
