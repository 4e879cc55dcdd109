"""The code Spark generates for a batch stays the same from batch to batch (codegen_stable.py).

Spark caches compiled query classes by their Java source. A batch whose LSN bounds or clock
end up in that source compiles its stages again, and the JIT compiles their loops again; on a
2-core machine that was a third of a streaming batch's CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_consumer import codegen_stable
from spark_consumer.batch import BatchProcessor
from spark_consumer.config import ConsumerConfig
from spark_consumer.writer_schemas import WriterSchemas
from tests.support.event_writer import ColumnSpec, EventWriter, TableSpec, registry_client
from tests.support.spark import KafkaLog, spark  # noqa: F401

pytestmark = pytest.mark.integration

# Values long enough that finding them in generated code cannot be a coincidence.
LOW, HIGH = 123_456_789_012, 987_654_321_098


def generated_code(df: DataFrame) -> str:
    """The Java source of the frame's whole-stage code, without Spark's line comments."""
    jvm = df.sparkSession._jvm
    assert jvm is not None
    text = jvm.org.apache.spark.sql.execution.debug.package.codegenString(
        df._jdf.queryExecution().executedPlan()
    )
    return "\n".join(line for line in text.splitlines() if line.startswith("/* "))


@pytest.mark.parametrize(
    "name, ours, plain",
    [
        ("greater", codegen_stable.greater, lambda c, v: c > F.lit(v)),
        ("at_most", codegen_stable.at_most, lambda c, v: c <= F.lit(v)),
        ("or_value", codegen_stable.or_value, lambda c, v: F.coalesce(c, F.lit(v))),
    ],
)
def test_codegen_stable_values_equal_the_plain_expressions_with_one_code(
    spark: SparkSession,
    name: str,
    ours: Callable[[str, int], Column],
    plain: Callable[[Column, int], Column],
) -> None:
    values = [None, -1, 0, LOW - 1, LOW, LOW + 1, HIGH, 2**63 - 1]
    df = spark.createDataFrame([(v,) for v in values], "lsn long").persist()
    codes = []
    for bound in (LOW, HIGH):
        got = df.select(ours("lsn", bound).alias("x")).collect()
        want = df.select(plain(F.col("lsn"), bound).alias("x")).collect()
        assert got == want, f"{name} with {bound}"
        code = generated_code(df.select(ours("lsn", bound).alias("x")))
        assert code and str(bound) not in code, f"{name}: {bound} is in the generated code"
        codes.append(code)
    assert codes[0] == codes[1], f"{name}: the generated code depends on the value"
    df.unpersist()


TABLE = TableSpec(
    "public",
    "items",
    (
        ColumnSpec("id", "long", "int8"),
        ColumnSpec(
            "price",
            {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
            "numeric(12,2)",
        ),
    ),
    ("id",),
)


def test_consecutive_batches_compile_no_new_code_for_their_rows(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Batches of one shape with new LSNs and a new clock each: once warm, a batch compiles no
    class at all. (With the progress row's values as literals it compiled 2, with
    the clock as a literal in the framing stage 4, with the LSN bounds as literals in the
    changes' filter 5.)"""
    client = registry_client("mock://codegen")
    writer = EventWriter(client, "cg")
    cfg = ConsumerConfig(
        kafka_bootstrap="-",
        schema_registry_url="mock://codegen",
        topic_prefix="cg",
        lake_path=str(tmp_path / "lake"),
        checkpoint_path=str(tmp_path / "cp"),
        trigger=None,
        available_now=True,
    )
    clock = iter(range(1_700_000_000_000, 1_800_000_000_000, 7_777))
    processor = BatchProcessor(spark, cfg, WriterSchemas(client), clock_ms=lambda: next(clock))
    log = KafkaLog()
    jvm = spark._jvm
    assert jvm is not None
    compilations = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    counts = []
    # Batch 0 goes into the empty table by append (merge's empty-table path), so batch 1 is the
    # first MERGE and compiles its code. Batch 2 compiles its progress row once more: Spark laid
    # out batch 1's source with one blank line more (same code otherwise). From then on, a
    # batch compiles nothing.
    for b in range(6):
        tx = writer.transaction(1000 + b, (1000 + b) * 1000)
        for i in range(20):  # new keys, then updates of earlier ones
            key = b * 20 + i if i < 15 else (b * 20 + i - 15)
            op = tx.insert if i < 15 else tx.update
            op(TABLE, {"id": key, "price": Decimal(f"{b}.{i:02d}")})
        frame = log.frame(spark, tx.records())
        before = compilations.getCount()
        processor.process(frame, b)
        counts.append(compilations.getCount() - before)
    assert counts[3:] == [0, 0, 0], f"classes compiled per batch: {counts}"
