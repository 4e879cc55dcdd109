"""schemas.client_config: secret files, k=v lists, and librdkafka -> Java (Spark) translation.
No error message may carry a value: values can be passwords."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer.config import load_config
from producer.errors import ConfigError
from schemas.client_config import (
    ClientConfigError,
    java_kafka_options,
    parse_pairs,
    registry_client_config,
    with_secret_files,
)
from spark_consumer.config import parse_run
from spark_consumer.errors import ConfigError as ConsumerConfigError

pytestmark = pytest.mark.unit

SECRET = "s3cr3t-Pa55"
SECURE = (
    f"security.protocol=SASL_SSL,sasl.mechanisms=SCRAM-SHA-512,sasl.username=walbridge-consumer,"
    f"sasl.password={SECRET},ssl.ca.location=/tls/ca.pem"
)


def test_secret_files_replace_their_variable(tmp_path: Path) -> None:
    dsn = tmp_path / "dsn"
    dsn.write_text(f"postgresql://u:{SECRET}@h/db\n")
    env = with_secret_files({"WALBRIDGE_PG_DSN_FILE": str(dsn), "OTHER": "x"})
    assert env == {"WALBRIDGE_PG_DSN": f"postgresql://u:{SECRET}@h/db", "OTHER": "x"}


def test_secret_file_and_variable_together_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text("a=b")
    with pytest.raises(ClientConfigError, match="both set; set one"):
        with_secret_files(
            {"WALBRIDGE_KAFKA_CONFIG": "a=b", "WALBRIDGE_KAFKA_CONFIG_FILE": str(path)}
        )


def test_unreadable_secret_file_names_the_path_not_a_value(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ClientConfigError, match="WALBRIDGE_SCHEMA_REGISTRY_CONFIG_FILE") as exc:
        with_secret_files({"WALBRIDGE_SCHEMA_REGISTRY_CONFIG_FILE": str(missing)})
    assert str(missing) in str(exc.value)


def test_pairs_refuse_repeats_and_items_without_equals_without_echoing_them() -> None:
    assert parse_pairs(" a = 1 , b=x=y ,", "X") == {"a": "1", "b": "x=y"}
    with pytest.raises(ClientConfigError, match="'a' is set twice"):
        parse_pairs("a=1,a=2", "X")
    with pytest.raises(ClientConfigError) as exc:
        parse_pairs(f"sasl.password=x,{SECRET}", "X")
    assert SECRET not in str(exc.value)


def test_registry_config_checks_keys_and_types() -> None:
    conf = registry_client_config(f"basic.auth.user.info=u:{SECRET},timeout=10")
    assert conf["timeout"] == 10 and conf["basic.auth.user.info"] == f"u:{SECRET}"
    with pytest.raises(ClientConfigError, match=r"unknown key\(s\) \['basic.auth.userinfo'\]"):
        registry_client_config(f"basic.auth.userinfo=u:{SECRET}")


def test_scram_over_tls_translates_to_java_options() -> None:
    java = java_kafka_options(parse_pairs(SECURE, "WALBRIDGE_KAFKA_CONFIG"))
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="walbridge-consumer" password="{SECRET}";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/tls/ca.pem",
    }


def test_jaas_values_are_quoted() -> None:
    java = java_kafka_options(
        {"sasl.mechanisms": "PLAIN", "sasl.username": 'a"b', "sasl.password": "c\\d"}
    )
    assert java["sasl.jaas.config"].endswith('username="a\\"b" password="c\\\\d";')


def test_untranslatable_keys_are_named_never_dropped() -> None:
    with pytest.raises(ClientConfigError, match=r"\['sasl.oauthbearer.config'\]"):
        java_kafka_options({"sasl.oauthbearer.config": SECRET})
    with pytest.raises(ClientConfigError, match=r"needs sasl\.username and sasl\.password") as exc:
        java_kafka_options({"sasl.mechanisms": "SCRAM-SHA-256", "sasl.password": SECRET})
    assert SECRET not in str(exc.value)


BASE = {
    "WALBRIDGE_PG_DSN": f"postgresql://u:{SECRET}@h/db",
    "WALBRIDGE_KAFKA_BOOTSTRAP": "k:9092",
    "WALBRIDGE_SCHEMA_REGISTRY_URL": "https://r",
}


def test_the_producer_reads_secrets_from_files_and_keeps_them_out_of_repr(tmp_path: Path) -> None:
    kafka = tmp_path / "kafka"
    kafka.write_text(SECURE + "\n")
    registry = tmp_path / "registry"
    registry.write_text(f"basic.auth.user.info=u:{SECRET}")
    env = BASE | {
        "WALBRIDGE_KAFKA_CONFIG_FILE": str(kafka),
        "WALBRIDGE_SCHEMA_REGISTRY_CONFIG_FILE": str(registry),
    }
    config = load_config([], env)
    assert config.librdkafka_extra()["sasl.password"] == SECRET
    assert config.registry_client_config()["basic.auth.user.info"] == f"u:{SECRET}"
    assert SECRET not in repr(config)
    with pytest.raises(ConfigError, match="unknown key") as exc:
        load_config([], BASE | {"WALBRIDGE_SCHEMA_REGISTRY_CONFIG": f"password={SECRET}"})
    assert SECRET not in str(exc.value)


def test_the_consumer_maps_kafka_config_to_spark_options(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    registry.write_text(f"basic.auth.user.info=u:{SECRET}")
    env = {
        "WALBRIDGE_KAFKA_BOOTSTRAP": "k:9093",
        "WALBRIDGE_SCHEMA_REGISTRY_URL": "https://r",
        "WALBRIDGE_TOPIC_PREFIX": "walbridge",
        "WALBRIDGE_LAKE_PATH": str(tmp_path / "lake"),
        "WALBRIDGE_KAFKA_CONFIG": SECURE,
        "WALBRIDGE_SCHEMA_REGISTRY_CONFIG_FILE": str(registry),
    }
    config = parse_run([], env)
    assert config.kafka_config["sasl.username"] == "walbridge-consumer"  # the AdminClient's
    assert config.spark_kafka_options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert config.spark_kafka_options["kafka.ssl.truststore.location"] == "/tls/ca.pem"
    assert config.registry_config["basic.auth.user.info"] == f"u:{SECRET}"
    assert SECRET not in repr(config)
    with pytest.raises(ConsumerConfigError, match=r"sasl\.kerberos\.keytab") as exc:
        parse_run([], env | {"WALBRIDGE_KAFKA_CONFIG": f"sasl.kerberos.keytab={SECRET}"})
    assert SECRET not in str(exc.value)
