"""`python -m spark_consumer run|verify` (console script `walbridge-consumer`)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spark_consumer.errors import ConsumerError
from spark_consumer.metrics import ConsumerMetrics

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger("walbridge.consumer")

USAGE = "usage: walbridge-consumer {run,verify} [options]  (--help after the command for options)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=os.environ.get("WALBRIDGE_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args or args[0] not in ("run", "verify"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        return _run(args[1:]) if args[0] == "run" else _verify(args[1:])
    except ConsumerError as exc:
        print(f"walbridge-consumer: {exc}", file=sys.stderr)
        return 1


def _run(argv: list[str]) -> int:
    from spark_consumer.batch import BatchProcessor
    from spark_consumer.config import parse_run
    from spark_consumer.session import build_session
    from spark_consumer.source import start
    from spark_consumer.writer_schemas import WriterSchemas

    config = parse_run(argv, os.environ)  # fail fast, before Spark starts
    metrics = ConsumerMetrics()
    if config.metrics_port:
        metrics.serve("0.0.0.0", config.metrics_port)
    spark = build_session("walbridge-consumer")
    processor = BatchProcessor(
        spark,
        config,
        WriterSchemas.from_url(config.schema_registry_url, config.registry_config),
        metrics=metrics,
    )
    from pyspark.errors import StreamingQueryException

    query = start(spark, config, processor)
    try:
        _watch(query, metrics)
    except StreamingQueryException as exc:
        # The batch's ConsumerError arrives wrapped; its message names topic/partition/offset
        # or the transaction.
        print(f"walbridge-consumer: stopped: {exc.getMessage()}", file=sys.stderr)
        return 1
    return 0


def _watch(query: StreamingQuery, metrics: ConsumerMetrics, every_s: int = 5) -> None:
    """Wait for the query to end; meanwhile turn Spark's progress into the Kafka lag and the
    catch-up ETA, logged once per new batch while the job is behind."""
    seen = None
    while not query.awaitTermination(every_s):
        progress = query.lastProgress
        if not progress or progress.get("batchId") == seen:
            continue
        seen = progress.get("batchId")
        state = metrics.observe_progress(progress)
        if state is not None and state.behind:
            log.info(
                "catching up: %d Kafka record(s) behind, %s records/s, ETA %s",
                state.behind,
                f"{state.records_per_s:.0f}" if state.records_per_s else "-",
                f"{state.eta_s:.0f}s" if state.eta_s is not None else "unknown",
            )


def _verify(argv: list[str]) -> int:
    from spark_consumer import verify
    from spark_consumer.config import parse_verify
    from spark_consumer.session import build_session

    config = parse_verify(argv, os.environ)
    spark = build_session("walbridge-verify")
    diffs = verify.run(config, spark)
    print(verify.report(diffs))
    return 0 if all(d.equal for d in diffs) else 1


if __name__ == "__main__":
    sys.exit(main())
