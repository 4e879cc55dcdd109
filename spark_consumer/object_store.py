"""Pure: the Maven package and Spark settings that `s3a://` lake and checkpoint paths need, from
the standard AWS variables alone (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_REGION), the ones delta-rs and the AWS tools read too, so no S3 setting is spelled twice.

Hadoop's S3A file system comes in `hadoop-aws`, which must match the Hadoop client that Spark
ships (pyspark 4.0: Hadoop 3.4.1, built against the AWS SDK v2 bundle that Ivy resolves with it).
It is added only when an `s3a://` path is configured or AWS_ENDPOINT_URL is set: its SDK bundle
is over 500 MB, which runs on local disks have no use for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

S3A = "s3a://"
# Seconds without a byte on an object store connection before S3A drops it and retries the
# request (S3A's own default, 200 s, let one silent link hold a batch for minutes). Silence,
# not slowness: a slow upload that keeps sending is never cut. S3A raises anything lower than
# 15 s to 15 s, with only a warning.
DEFAULT_SOCKET_TIMEOUT_S = 60.0
MIN_SOCKET_TIMEOUT_S = 15.0
_HADOOP_CLIENT = re.compile(r"^hadoop-client-api-(?P<version>\d+\.\d+\.\d+)\.jar$")


def uses_s3a(env: Mapping[str, str], paths: Iterable[str] = ()) -> bool:
    candidates = [
        *paths,
        env.get("WALBRIDGE_LAKE_PATH", ""),
        env.get("WALBRIDGE_CHECKPOINT_PATH", ""),
    ]
    return bool(env.get("AWS_ENDPOINT_URL")) or any(p.startswith(S3A) for p in candidates)


def hadoop_version(spark_jars: Path) -> str:
    """The Hadoop client version Spark ships (its `hadoop-client-api-<version>.jar`)."""
    for jar in spark_jars.glob("hadoop-client-api-*.jar"):
        match = _HADOOP_CLIENT.match(jar.name)
        if match:
            return match.group("version")
    raise RuntimeError(f"no hadoop-client-api jar in {spark_jars}: which Hadoop does Spark ship?")


def ships_s3a(spark_jars: Path) -> bool:
    """Spark's own jars already hold hadoop-aws (the consumer image bakes it in)."""
    return any(spark_jars.glob("*hadoop-aws-*.jar"))


def s3a_package(hadoop: str) -> str:
    return f"org.apache.hadoop:hadoop-aws:{hadoop}"


def s3a_conf(
    env: Mapping[str, str], socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S
) -> dict[str, str]:
    """Spark settings for S3A from the standard AWS variables.

    The keys go into the Hadoop configuration (`spark.hadoop.*`) rather than the executors'
    environment: executors on a standalone or Kubernetes cluster do not inherit the driver's
    environment. Spark redacts `*secret*` settings in its UI and logs.
    """
    conf: dict[str, str] = {
        # Spark's default checkpoint manager creates files through Hadoop's FileContext, which
        # first asks whether the parent "directory" exists; on object stores that answer comes
        # from directory markers, which S3-compatible stores emulate unevenly (s3proxy's
        # backends answered "missing" or "a file"). FileSystem.create asks nothing of parents.
        "spark.sql.streaming.checkpointFileManagerClass": (
            "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
        ),
    }
    # A silent connection (half-open, a frozen store) is dropped after this much silence and
    # the request retried by S3A with backoff (fs.s3a.retry.*), like any broken connection.
    conf["spark.hadoop.fs.s3a.connection.timeout"] = f"{round(socket_timeout_s * 1000)}ms"
    endpoint = env.get("AWS_ENDPOINT_URL")
    if endpoint:
        # An S3-compatible store: its own endpoint, and buckets in the path, not the host name.
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            endpoint.startswith("https:")
        ).lower()
        # S3A probes before mkdir and create whether a "file" sits where a directory goes; stores
        # that emulate directories answer that unevenly (s3proxy's filesystem-nio2 reports the
        # directory `x/` as a file `x`). The consumer never puts a file where it makes a
        # directory, so it skips those probes on any store but AWS's own.
        conf["spark.hadoop.fs.s3a.performance.flags"] = "mkdir,create"
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        conf["spark.hadoop.fs.s3a.access.key"] = key
        conf["spark.hadoop.fs.s3a.secret.key"] = secret
        conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        )
        token = env.get("AWS_SESSION_TOKEN")
        if token:
            conf["spark.hadoop.fs.s3a.session.token"] = token
            conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = (
                "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            )
    return conf
