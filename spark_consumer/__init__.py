"""The PySpark consumer: Kafka (Avro events + transaction markers) -> whole source
transactions -> guarded Delta MERGE per table, plus the progress table readers use for
consistent multi-table snapshots. Entry points: `python -m spark_consumer run|verify`;
`source.start` + `batch.BatchProcessor` for embedding in another Spark application."""
