"""Where undecodable records go when a quarantine path is configured (a Delta table)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

# One Delta application id per place a batch quarantines from: records rejected by their framing
# (before decoding) and records whose body did not decode. Both can happen in one batch, and
# Delta skips a second write with the same (txnAppId, txnVersion): with one id, the second set
# was silently dropped, neither applied nor quarantined.
FRAMING = "walbridge-quarantine"  # the original id: replays of batches written before keep it
DECODING = "walbridge-quarantine-decoded"


def write(rows: DataFrame, path: str, batch_id: int, app_id: str = FRAMING) -> None:
    """Append raw records with the reason; idempotent per (``app_id``, batch id)."""
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
        .option("txnAppId", app_id)
        .option("txnVersion", batch_id)
        .save(path)
    )
