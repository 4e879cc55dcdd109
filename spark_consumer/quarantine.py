"""Where undecodable records go when a quarantine path is configured (a Delta table)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def write(rows: DataFrame, path: str, batch_id: int) -> None:
    """Append raw records with the reason; idempotent per batch id (Delta txnAppId)."""
    (
        rows.select(
            "topic",
            "partition",
            "offset",
            "key",
            "value",
            "timestamp",
            F.col("_reason").alias("reason"),
            F.lit(batch_id).alias("batch_id"),
        )
        .write.format("delta")
        .mode("append")
        .option("txnAppId", "walbridge-quarantine")
        .option("txnVersion", batch_id)
        .save(path)
    )
