"""The streaming query's offsets log (`<checkpoint>/offsets/<batch id>`), read through Hadoop's
file system API: a local path and an object store alike.

Spark writes a batch's entry before the batch runs and reads it again for a replay, so what it
says about a batch is the same on every run of it (batch_cap.py parses it)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession


def _log_dir(spark: SparkSession, checkpoint_path: str) -> tuple[Any, Any]:
    """(Hadoop FileSystem, Path) of the offsets log directory."""
    jvm = spark._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(checkpoint_path.rstrip("/") + "/offsets")
    return path.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf()), path


def has_entries(spark: SparkSession, checkpoint_path: str) -> bool:
    """Whether the query's checkpoint has planned a batch."""
    fs, path = _log_dir(spark, checkpoint_path)
    return bool(fs.exists(path)) and len(fs.listStatus(path)) > 0


def entry(spark: SparkSession, checkpoint_path: str, batch_id: int) -> str | None:
    """The text of batch ``batch_id``'s entry; None when there is none (a batch before the
    first one, or one Spark's retention has removed)."""
    jvm = spark._jvm
    assert jvm is not None
    fs, log_dir = _log_dir(spark, checkpoint_path)
    path = jvm.org.apache.hadoop.fs.Path(log_dir, str(batch_id))
    if batch_id < 0 or not fs.exists(path):
        return None
    stream = fs.open(path)
    try:
        return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()
