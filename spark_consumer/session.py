"""Build the SparkSession the consumer and the tests use.

The Kafka source, Avro functions and Delta Lake come as Maven artifacts resolved through
``spark.jars.packages``; their versions follow the installed pyspark/delta-spark so the
Scala binaries always match the Python side.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib.metadata import version
from pathlib import Path

import pyarrow as pa
import pyspark
from pyspark.sql import SparkSession

from spark_consumer import checkpoints, class_archive, jar_manifest, object_store
from spark_consumer.config import SparkSettings

log = logging.getLogger("walbridge.consumer")

SCALA_BINARY = "2.13"
DATAFRAME_DEBUGGING = "spark.python.sql.dataFrameDebugging.enabled"
# The class-data archive this session's JVM and jars map (class_archive.py), for warm-up and
# logs: set whether or not the file exists.
ARCHIVE_CONF = "spark.walbridge.classArchive"


def walbridge_home(settings: SparkSettings) -> Path:
    """State directory of the local stack (downloads, caches), default `.walbridge/` in the checkout."""
    default = Path(__file__).resolve().parent.parent / ".walbridge"
    return Path(settings.home or default).resolve()


def ivy_dir(settings: SparkSettings) -> Path:
    """Where `spark.jars.packages` resolves and keeps the connector jars. The local stack's test
    and demo commands point it at their download cache, so a fresh clone resolves nothing twice."""
    return (
        Path(settings.ivy_dir).resolve() if settings.ivy_dir else walbridge_home(settings) / "ivy2"
    )


def connector_version(settings: SparkSettings) -> str:
    """Version of the Spark Kafka/Avro connector jars: the `.0` release of pyspark's minor line.

    The connectors are binary compatible within a minor line, and Maven Central can lag PyPI
    (for pyspark 4.0.5 only 4.0.0 had all of spark-sql-kafka, spark-token-provider-kafka and
    spark-avro), so the `.0` release is the one that always resolves.
    WALBRIDGE_SPARK_CONNECTOR_VERSION overrides it.
    """
    if settings.connector_version:
        return settings.connector_version
    major, minor = version("pyspark").split(".")[:2]
    return f"{major}.{minor}.0"


def maven_packages(settings: SparkSettings) -> list[str]:
    spark = connector_version(settings)
    delta = version("delta-spark")
    return [
        f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{spark}",
        f"org.apache.spark:spark-avro_{SCALA_BINARY}:{spark}",
        f"io.delta:delta-spark_{SCALA_BINARY}:{delta}",
    ]


def driver_class_archive(
    settings: SparkSettings, env: Mapping[str, str], spark_jars: Sequence[str]
) -> Path:
    """The driver JVM's class-data archive for this JDK, this Spark and these jars
    (class_archive.py): it may not exist yet."""
    spark_jars_dir = Path(pyspark.__file__).resolve().parent / "jars"
    key = class_archive.archive_key(
        class_archive.java_release(env), pyspark.__version__, str(spark_jars_dir), spark_jars
    )
    return class_archive.archive_path(walbridge_home(settings), key)


def build_session(
    app_name: str = "walbridge",
    master: str | None = None,
    shuffle_partitions: int | None = None,
    extra_conf: dict[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    lake_paths: Iterable[str] = (),
    dump_class_archive: Path | None = None,
) -> SparkSession:
    """A session with Kafka, Avro and Delta; sized for a small machine unless overridden.

    Shuffles default to one partition per core of the master (adaptive execution still merges
    small ones); `shuffle_partitions` or `extra_conf` can set them. On `local[2]` a 1M-change
    batch took 14.1-15.1 s with 2 partitions against 16.5-16.7 s with the former fixed 4, in
    interleaved runs.

    `env` (default: this process's environment) gives the Spark settings (`SparkSettings`) and
    the object store's AWS_* variables, which keep the AWS SDKs' own names; `lake_paths` are
    the lake and checkpoint paths given by flag, so an s3a:// lake brings the S3 connector.
    `dump_class_archive` (warm-up only) makes the driver JVM write its class-data archive
    there when it exits, instead of mapping one.
    """
    env = os.environ if env is None else env
    settings = SparkSettings.from_env(env)
    # The driver plans every batch from Arrow tables (transaction_stats, reassembly). pyarrow's
    # default pool (mimalloc) kept the pages they freed: in a catch-up the Python driver grew
    # from 210 MB to 640-730 MB; with the C library's allocator, whose large blocks go back to
    # the system when freed, planning a 36k-transaction summary over and over holds it flat.
    pa.set_memory_pool(pa.system_memory_pool())
    ivy = ivy_dir(settings)
    # Python workers (mapInArrow, UDFs) must run this interpreter: the venv has pyarrow and
    # fastavro, a bare `python3` on PATH may not. PySpark reads only the environment for this.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or settings.master)
        .config("spark.jars.ivy", str(ivy))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.adaptive.enabled", "true")
        # A batch's caches live for one batch and are read a few times: compressing their
        # column batches cost more than it saved. On one warm JVM, caching 1M decoded rows of the
        # 8-column table took 3.0 s uncompressed against 4.4-5.5 s; a whole 1M-change mixed
        # batch 21.1-21.7 s against 22.3-24.5 s. They still spill to disk.
        .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
        # Delta's own defaults favour big clusters; these keep small local runs fast.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.databricks.delta.optimizeWrite.enabled", "false")
        # New tables never checkpoint inside a commit: the consumer writes their checkpoints
        # on a background thread (checkpoints.py), so every tenth commit stops costing a batch
        # several seconds.
        .config(checkpoints.DEFAULTS_CONF, str(checkpoints.IN_COMMIT_INTERVAL))
        # merge.py caches every MERGE source that is read more than once (in memory, spilling
        # to disk) before the MERGE; the other MERGEs are insert-only and read theirs once.
        # Delta's own copy (to disk by default) would be a second one.
        .config("spark.databricks.delta.merge.materializeSource", "none")
        # Spark keeps the classes it generates for queries in a cache of 100 by default. One
        # batch of one table (framing, decode, cache, summary, collapse, Delta's MERGE or write,
        # its log replay and stats) uses more than that, so every batch compiled most of them
        # again and the JIT compiled their hot loops again: on a warm JVM, a 1M-change batch
        # spent 10-15 s of its 35-42 s of CPU in JIT compiler threads and took 19-22 s; with
        # 1000 entries, 11-14 s. Both code heaps and metaspace stayed the same size.
        .config("spark.sql.codegen.cache.maxEntries", "1000")
        # PySpark 4 wraps every DataFrame and Column function to hand the JVM the Python line
        # that called it (for the query context of analysis errors): four more Py4J round
        # trips per call (the active session, the origin class, a conf read, set and clear).
        # A batch builds a few thousand Columns, so on a busy 2-core machine that was most of
        # the driver's planning time. Errors still name the failing expression.
        .config(DATAFRAME_DEBUGGING, "false")
    )
    packages = maven_packages(settings)
    if object_store.uses_s3a(env, lake_paths):
        jars = Path(pyspark.__file__).resolve().parent / "jars"
        if not object_store.ships_s3a(jars):  # the consumer image has it in Spark's jars
            packages.append(object_store.s3a_package(object_store.hadoop_version(jars)))
        for key, value in object_store.s3a_conf(env, settings.object_store_timeout_s).items():
            builder = builder.config(key, value)
    # Ivy resolves the packages at every JVM start unless this cache already knows their jars.
    recorded = jar_manifest.recorded_jars(ivy, packages)
    if recorded is None:
        builder = builder.config("spark.jars.packages", ",".join(packages))
    else:
        builder = builder.config("spark.jars", ",".join(recorded))
    # Without a manifest Ivy decides the jars, and the archive's key is known only after.
    archive = None if recorded is None else driver_class_archive(settings, env, recorded)
    java_options = []
    mapped = False
    if settings.driver_java_options and (master or settings.master).startswith("local"):
        # Only where the driver's JVM runs the executors too (config.SparkSettings says why).
        java_options.append(settings.driver_java_options)
    if dump_class_archive is not None:
        java_options += class_archive.dump_options(dump_class_archive)
    elif settings.class_archive and archive is not None:
        mapping = class_archive.use_options(archive)
        mapped = bool(mapping)
        java_options += mapping
    if java_options:
        builder = builder.config("spark.driver.defaultJavaOptions", " ".join(java_options))
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if recorded is None:
        jar_manifest.record_jars(ivy, packages, spark.sparkContext.getConf().get("spark.jars", ""))
        recorded = jar_manifest.recorded_jars(ivy, packages)
        if recorded is not None:
            archive = driver_class_archive(settings, env, recorded)
    if archive is not None:
        spark.conf.set(ARCHIVE_CONF, str(archive))
        if dump_class_archive is None and settings.class_archive and not mapped:
            log.info(
                "no class-data archive for the driver JVM at %s: `walbridge-consumer warm-up` "
                "writes one, and later starts are faster",
                archive,
            )
    # A runtime SQL setting: the core count is known only once the context is up.
    if shuffle_partitions is None and "spark.sql.shuffle.partitions" not in (extra_conf or {}):
        shuffle_partitions = spark.sparkContext.defaultParallelism
    if shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(max(1, shuffle_partitions)))
    return spark
