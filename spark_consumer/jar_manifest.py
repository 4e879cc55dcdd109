"""The connector jars a session resolved, remembered so that the next JVM start skips Ivy.

`spark.jars.packages` makes every JVM start resolve the Maven coordinates again, through Ivy,
even when every jar is in the cache: 13 s of a consumer's start on this 2-core machine under the
torture load (`:: resolution report :: resolve 13173ms`), paid again after every restart. The
first session that resolves a set of packages records the jars Spark put on `spark.jars`
(SparkSubmit adds the resolved files there) in a manifest beside the Ivy cache, named after the
coordinates; later sessions asking for the same coordinates pass those files as `spark.jars`
and never start Ivy. A manifest whose files are gone is ignored (the session resolves again and
rewrites it). Spark has no such cache of its own: its Ivy resolution always runs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path


def manifest_path(ivy_dir: Path, packages: Sequence[str]) -> Path:
    digest = hashlib.sha256(",".join(sorted(packages)).encode()).hexdigest()[:16]
    return ivy_dir / f"walbridge-jars-{digest}.txt"


def recorded_jars(ivy_dir: Path, packages: Sequence[str]) -> list[str] | None:
    """The jar URIs recorded for exactly these packages, if every file is still there."""
    path = manifest_path(ivy_dir, packages)
    try:
        lines = path.read_text().split("\n")
    except OSError:
        return None
    if not lines or lines[0] != ",".join(sorted(packages)):
        return None  # another set of coordinates with the same digest prefix, or a torn file
    jars = [line for line in lines[1:] if line]
    if not jars or not all(Path(_local(uri)).is_file() for uri in jars):
        return None
    return jars


def record_jars(ivy_dir: Path, packages: Sequence[str], spark_jars: str) -> None:
    """Keep what a resolving session put on `spark.jars` (its files under the Ivy directory
    only: jars a caller added by hand are not the packages')."""
    root = str(ivy_dir.resolve())
    jars = [uri for uri in spark_jars.split(",") if uri and _local(uri).startswith(root + os.sep)]
    if not jars:
        return
    path = manifest_path(ivy_dir, packages)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        partial.write_text("\n".join([",".join(sorted(packages)), *jars]) + "\n")
        partial.replace(path)  # atomic: a concurrent start reads the old manifest or the new one
    except OSError:
        # A read-only cache (an image's, say) only means the next start resolves again.
        partial.unlink(missing_ok=True)


def _local(uri: str) -> str:
    return uri.removeprefix("file://") if uri.startswith("file://") else uri
