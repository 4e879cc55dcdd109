"""Image build step: put the consumer's connector jars in the image (see consumer.Containerfile).

Starts the consumer's own SparkSession once (spark_consumer/session.py: the same Maven
coordinates the consumer asks for), which fills the ivy cache (`ivy_dir`: under WALBRIDGE_HOME
unless WALBRIDGE_SPARK_IVY_DIR says otherwise), then copies each resolved jar into
$SPARK_HOME/jars unless Spark already ships that artifact (a second copy of, say, lz4-java at
another version on the system classpath would be a conflict).

Then Hadoop's S3A file system (`s3a://` lake and checkpoint paths): hadoop-aws at the version of
the Hadoop client that Spark ships, with the AWS SDK bundle it was built against, resolved by
Spark's own Ivy (its command line) into a scratch directory that is deleted afterwards; its Ivy
cache is $BAKE_S3A_IVY_CACHE if set (the Containerfile's build cache mount, so a rebuild
downloads nothing), else a directory in that scratch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from spark_consumer.config import SparkSettings
from spark_consumer.session import build_session, ivy_dir

# ivy names retrieved jars `<group>_<artifact>-<version>.jar`; Spark's own are `<artifact>-<version>.jar`.
IVY_JAR = re.compile(r"^(?P<group>[^_]+)_(?P<artifact>.+)-(?P<version>[0-9][^-]*(?:-[^-]+)?)\.jar$")
SPARK_JAR = re.compile(r"^(?P<artifact>.+)-(?P<version>[0-9][^-]*(?:-[^-]+)?)\.jar$")


def artifact_names(jars: Path) -> set[str]:
    return {m.group("artifact") for p in jars.glob("*.jar") if (m := SPARK_JAR.match(p.name))}


def hadoop_version(jars: Path) -> str:
    for path in jars.glob("hadoop-client-api-*.jar"):
        match = SPARK_JAR.match(path.name)
        if match:
            return match.group("version")
    raise SystemExit(f"bake: no hadoop-client-api jar in {jars}: which Hadoop does Spark ship?")


def resolve_s3a(jars: Path, into: Path) -> None:
    """hadoop-aws and its runtime dependencies, as `<group>_<artifact>-<version>.jar` files."""
    ivy = next(jars.glob("ivy-*.jar"), None)
    if ivy is None:
        raise SystemExit(f"bake: Spark's Ivy jar is not in {jars}")
    pattern = str(into / "[organisation]_[artifact]-[revision](-[classifier]).[ext]")
    cache = os.environ.get("BAKE_S3A_IVY_CACHE") or str(into / "cache")
    subprocess.run(
        ["java", "-jar", str(ivy), "-cache", cache, "-confs", "default",
         "-dependency", "org.apache.hadoop", "hadoop-aws", hadoop_version(jars),
         "-types", "jar", "-retrieve", pattern],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip


def copy_new(resolved: Path, target: Path) -> int:
    shipped = artifact_names(target)
    copied = 0
    for jar in sorted(resolved.glob("*.jar")):
        match = IVY_JAR.match(jar.name)
        if match is None:
            raise SystemExit(f"bake: can't read artifact and version from {jar.name}")
        if match.group("artifact") in shipped:
            print(
                f"bake: Spark already ships {match.group('artifact')}; keeping Spark's",
                file=sys.stderr,
            )
            continue
        shutil.copy2(jar, target / jar.name)
        copied += 1
        print(f"bake: {jar.name} -> {target}", file=sys.stderr)
    if copied == 0:
        raise SystemExit(f"bake: no jar was resolved into {resolved}")
    return copied


def main() -> int:
    spark = build_session("walbridge-image-bake")
    try:
        spark.range(1).count()  # the session really works with these jars
    finally:
        spark.stop()
    target = Path(os.environ["SPARK_HOME"]) / "jars"
    copy_new(ivy_dir(SparkSettings.from_env(os.environ)) / "jars", target)
    with tempfile.TemporaryDirectory() as scratch:
        resolve_s3a(target, Path(scratch))
        copy_new(Path(scratch), target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
