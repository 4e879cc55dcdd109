"""Class-data sharing for the driver JVM: a cold consumer start maps the classes a previous run
loaded from an archive instead of loading, parsing and verifying them from the jars again.

A restarted consumer's JVM loads some 30,000 classes (Spark, Scala, Delta, Kafka) before its
first batch commits; on this 2-core machine that is most of its start. Java 17's dynamic
AppCDS archive (`-XX:ArchiveClassesAtExit` on a training run, `-XX:SharedArchiveFile` on the
next ones) keeps them ready to map. `walbridge-consumer warm-up` runs the training (a session,
a Delta write, MERGE and read, the Kafka source's classes) and writes the archive; the consumer
image bakes one in. A session passes the archive only if it exists.

The archive's name is keyed by the JDK's release, Spark's version and jar directory, and the
exact connector jars the session puts on `spark.jars`, so a session whose JVM or jars changed
looks for another file (and runs without one until the next warm-up). The JVM checks the rest
itself: an archive that does not match its class path or JDK build is refused with a warning,
and the JVM runs on without it (`-Xshare:auto`, the default), as a missing archive does.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

ARCHIVE_DIR = "jvm-class-archive"


def java_release(env: Mapping[str, str]) -> str:
    """What identifies the JDK Spark's launcher will start: `$JAVA_HOME/bin/java`, else `java`
    on PATH (as spark-class picks it), by its real path and its `release` file."""
    home = env.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java", path=env.get("PATH"))
    if not java:
        return ""
    real = Path(java).resolve()
    try:
        release = (real.parent.parent / "release").read_text()
    except OSError:
        release = ""
    return f"{real}\n{release}"


def archive_key(java: str, spark_version: str, spark_jars_dir: str, jars: Sequence[str]) -> str:
    """A digest of what the archived classes came from; the jars in their class-path order."""
    text = "\n".join([java, spark_version, spark_jars_dir, *jars])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def archive_path(home: Path, key: str) -> Path:
    return home / ARCHIVE_DIR / f"driver-{key}.jsa"


def size_path(archive: Path) -> Path:
    return archive.with_name(f"{archive.name}.size")


def intact(archive: Path) -> bool:
    """Whether the archive is there with the size its training run recorded. The JVM maps the
    file's regions without reading them first: a truncated archive (a full disk, a partial
    copy) crashed it with SIGBUS, where one that is merely stale only makes it warn."""
    try:
        return size_path(archive).read_text().strip() == str(archive.stat().st_size)
    except OSError:
        return False


def use_options(archive: Path) -> list[str]:
    """JVM options that map the archive; none when it is missing or not whole."""
    return [f"-XX:SharedArchiveFile={archive}"] if intact(archive) else []


def install(partial: Path, archive: Path) -> None:
    """Put a training run's dump in place: its size first, then the file, each by an atomic
    rename, so a start in between sees a size that does not match and maps nothing."""
    size = size_path(archive)
    size_partial = size.with_name(f"{partial.name}.size")
    size_partial.write_text(f"{partial.stat().st_size}\n")
    size_partial.replace(size)
    partial.replace(archive)


def dump_options(partial: Path) -> list[str]:
    """JVM options of a training run: the archive is written when the JVM exits. The dump
    warns on stdout about each class it cannot keep (about 700: signed jars' and generated
    ones, which load as usual); errors only, and on stderr."""
    return [f"-XX:ArchiveClassesAtExit={partial}", "-Xlog:cds*=off", "-Xlog:cds*=error:stderr"]
