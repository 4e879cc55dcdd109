"""What a batch needs to know about one lake table, from one read of its Delta log.

Applying a table's share used to ask Delta the same things several times: whether the table
exists (three times), its properties (key and deletion-vector mode, each a `SHOW TBLPROPERTIES`
query), its version (twice) and its schema (a DataFrame over the table, three times). With a
few rows per table, those reads were most of a table's cost in a batch touching hundreds of
tables. One `DeltaLog.update()` answers all of them: a listing of the log directory, and the
snapshot's metadata (from the version's checksum file when Delta wrote one).

The file count comes from that checksum file too. `Snapshot.numOfFiles` rebuilds the version's
whole file list (three small Spark jobs): on a warm local JVM it took 0.9-1.8 s for a
14-version table against about a millisecond from the checksum, and it ran after every
table's commit in every batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import DataType, StructType

from spark_consumer.delta_version import updated_log

DELETION_VECTORS = "delta.enableDeletionVectors"  # the table property

NO_TABLE = -1  # Delta's version of a path without a table


@dataclass(frozen=True)
class LakeTable:
    path: str
    version: int  # NO_TABLE: no Delta table at the path yet
    schema: StructType = field(default_factory=StructType)
    properties: Mapping[str, str] = field(default_factory=dict)
    files: int = 0  # data files in the version (0: the table holds no row)
    size: int = 0  # bytes of those files

    @property
    def deletion_vectors(self) -> bool:
        """Whether a MERGE may write deletion vectors to the table."""
        return self.properties.get(DELETION_VECTORS, "false").strip().lower() == "true"

    @property
    def exists(self) -> bool:
        return self.version != NO_TABLE

    @property
    def columns(self) -> list[str]:
        return [f.name for f in self.schema.fields]

    @property
    def types(self) -> dict[str, DataType]:
        return {f.name: f.dataType for f in self.schema.fields}


def read(spark: SparkSession, path: str) -> LakeTable:
    """The table's latest state, from one update of its Delta log."""
    _log, snapshot = updated_log(spark, path)
    version = int(snapshot.version())
    if version == NO_TABLE:
        return LakeTable(path, NO_TABLE)
    # The metadata action as Delta writes it to the log: one Py4J call, where walking its
    # configuration map took two per property (about 80 per table and batch).
    metadata = json.loads(snapshot.metadata().json())["metaData"]
    return LakeTable(
        path,
        version,
        StructType.fromJson(json.loads(metadata["schemaString"])),
        {str(k): str(v) for k, v in (metadata.get("configuration") or {}).items()},
        *_files(snapshot),
    )


def _files(snapshot: Any) -> tuple[int, int]:  # a Py4J handle on Delta's Snapshot
    """The version's data files and their bytes: from its checksum file (written with every
    commit by Delta's default `writeChecksumFile.enabled`), else by rebuilding the file list."""
    checksum = snapshot.checksumOpt()
    if checksum.isDefined():
        return int(checksum.get().numFiles()), int(checksum.get().tableSizeBytes())
    return int(snapshot.numOfFiles()), int(snapshot.sizeInBytes())
