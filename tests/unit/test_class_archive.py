from __future__ import annotations

from pathlib import Path

from spark_consumer import class_archive
from spark_consumer.config import SparkSettings

JARS = ["file:///ivy/jars/a.jar", "file:///ivy/jars/b.jar"]


def key(java: str = "/jdk/bin/java\nJAVA_VERSION=17", jars: list[str] = JARS) -> str:
    return class_archive.archive_key(java, "4.0.5", "/venv/pyspark/jars", jars)


def test_the_key_changes_with_the_jdk_the_spark_or_the_jars() -> None:
    assert key() == key()
    assert key(java="/jdk/bin/java\nJAVA_VERSION=21") != key()
    assert class_archive.archive_key(JARS[0], "4.0.6", "/venv/pyspark/jars", JARS[1:]) != key()
    assert key(jars=[*JARS, "file:///ivy/jars/c.jar"]) != key()
    # The class path's order is part of what the JVM archived.
    assert key(jars=list(reversed(JARS))) != key()


def test_only_a_whole_archive_is_mapped(tmp_path: Path) -> None:
    archive = class_archive.archive_path(tmp_path, key())
    assert archive.parent == tmp_path / class_archive.ARCHIVE_DIR
    assert class_archive.use_options(archive) == []  # none yet
    archive.parent.mkdir()
    partial = archive.with_name("warm-up.1.partial")
    partial.write_bytes(b"archive")
    class_archive.install(partial, archive)
    assert not partial.exists()
    assert class_archive.use_options(archive) == [f"-XX:SharedArchiveFile={archive}"]
    archive.write_bytes(b"arch")  # truncated: the JVM would crash mapping it
    assert class_archive.use_options(archive) == []
    archive.write_bytes(b"archive")
    class_archive.size_path(archive).unlink()  # a file from elsewhere, no recorded size
    assert class_archive.use_options(archive) == []


def test_the_jdk_is_java_home_s_else_the_one_on_path(tmp_path: Path) -> None:
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("#!/bin/sh\n")
    (jdk / "bin" / "java").chmod(0o755)
    (jdk / "release").write_text('JAVA_VERSION="17.0.15"\n')
    by_home = class_archive.java_release({"JAVA_HOME": str(jdk)})
    assert by_home == f'{jdk / "bin" / "java"}\nJAVA_VERSION="17.0.15"\n'
    assert class_archive.java_release({"PATH": str(jdk / "bin")}) == by_home
    assert class_archive.java_release({"PATH": str(tmp_path / "nothing")}) == ""


def test_a_training_run_dumps_where_it_is_told_and_keeps_stdout_clean(tmp_path: Path) -> None:
    options = class_archive.dump_options(tmp_path / "x.partial")
    assert options[0] == f"-XX:ArchiveClassesAtExit={tmp_path / 'x.partial'}"
    assert "-Xlog:cds*=off" in options


def test_it_is_on_by_default_and_a_variable_turns_it_off() -> None:
    assert SparkSettings.from_env({}).class_archive is True
    assert SparkSettings.from_env({"WALBRIDGE_SPARK_CLASS_ARCHIVE": "false"}).class_archive is False


def test_a_dead_warm_up_s_partial_dump_is_removed_a_live_one_kept(tmp_path: Path) -> None:
    import os
    import subprocess

    from spark_consumer import warm_up

    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process
    (tmp_path / f"warm-up.{dead.pid}.partial").write_bytes(b"x")
    (tmp_path / f"warm-up.{os.getpid()}.partial").write_bytes(b"x")
    warm_up._drop_dead_partials(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"warm-up.{os.getpid()}.partial"]
