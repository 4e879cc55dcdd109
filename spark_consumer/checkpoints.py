"""Delta checkpoints written beside the batches, not inside them.

Delta checkpoints a table in the commit whose version is a multiple of the table's
`delta.checkpointInterval` (10 by default): the commit rebuilds the table's whole state and
writes it as Parquet before it returns. In the freshness benchmark (one table, a batch every
~5 s) every tenth batch paid that twice, once for the data table and once for the progress
table: 12.3 s against about 5 s for the others, and those batches set the p99.

The tables this consumer creates carry an interval so large that Delta never checkpoints in a
commit (`IN_COMMIT_INTERVAL`, set through the session's table defaults, see session.py); a
background thread checkpoints each table the batches wrote once it is `EVERY` versions past its
last checkpoint, while the next batch runs. Readers see the same log as before: a checkpoint
every ten versions or so, `_last_checkpoint` pointing to it, old log files cleaned up by Delta's
retention rules as part of the checkpoint.

A checkpoint is an optimisation of the log, not part of its contents: a failed or interrupted
one (the process killed mid-write) loses nothing, and Delta ignores an incomplete checkpoint.
Tables created before this (interval 10) keep Delta's checkpoints in the commit; the thread
finds them up to date and does nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from pyspark.sql import SparkSession

from spark_consumer.delta_version import updated_log

log = logging.getLogger("walbridge.consumer")

EVERY = 10  # versions between checkpoints: Delta's default interval
# Delta's `delta.checkpointInterval` for the tables the consumer creates: never reached by a
# table's commits in practice, so no commit checkpoints synchronously.
IN_COMMIT_INTERVAL = 1_000_000
DEFAULTS_CONF = "spark.databricks.delta.properties.defaults.checkpointInterval"


def due(version: int, checkpoint_version: int, every: int = EVERY) -> bool:
    """Whether a table at `version`, last checkpointed at `checkpoint_version` (-1: never),
    needs one."""
    return version >= every and version - max(checkpoint_version, 0) >= every


class Checkpointer:
    """One daemon thread checkpointing the lake tables named by `request`, one at a time.

    Requests for a table already waiting collapse into one: the thread reads the table's
    latest version when it gets to it."""

    def __init__(self, spark: SparkSession, every: int = EVERY) -> None:
        self._spark = spark
        self._every = every
        self._waiting: dict[str, None] = {}  # insertion-ordered set
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._busy = False  # a checkpoint is being written
        self.written = 0  # checkpoints written by this process (for tests and metrics)

    def request(self, paths: Iterable[str]) -> None:
        with self._cond:
            if self._closed:
                return
            for path in paths:
                self._waiting[path] = None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="walbridge-delta-checkpoints", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop after the checkpoint in progress (tables still waiting are left for the next
        run: their log is complete without them)."""
        with self._cond:
            self._closed = True
            self._waiting.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def drain(self, timeout_s: float = 300.0) -> None:
        """Wait until no table waits and none is being checkpointed (tests)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._waiting and not self._busy, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._closed or bool(self._waiting))
                if self._closed:
                    return
                path = next(iter(self._waiting))
                del self._waiting[path]
                self._busy = True
            try:
                self._checkpoint(path)
            except Exception as exc:  # the next request tries again; the log is complete
                log.warning("delta checkpoint of %s failed (retried later): %s", path, exc)

    def _checkpoint(self, path: str) -> None:
        jvm = self._spark._jvm
        assert jvm is not None
        delta_log, snapshot = updated_log(self._spark, path)
        version = int(snapshot.version())
        last = int(snapshot.checkpointProvider().version())
        if not due(version, last, self._every):
            return
        # Writes the checkpoint of this very version, then `_last_checkpoint`, then removes
        # log files older than the table's log retention (as Delta's commit hook does).
        delta_log.checkpoint(snapshot, jvm.scala.Option.empty())
        self.written += 1
        log.debug("delta checkpoint of %s at version %d", path, version)
