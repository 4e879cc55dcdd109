from __future__ import annotations

from pathlib import Path

from spark_consumer import jar_manifest

PACKAGES = ["org.example:a_2.13:1.0", "io.example:b_2.13:2.0"]


def jars(ivy: Path, *names: str) -> str:
    (ivy / "jars").mkdir(parents=True, exist_ok=True)
    for name in names:
        (ivy / "jars" / name).write_bytes(b"PK")
    return ",".join(f"file://{ivy / 'jars' / name}" for name in names)


def test_recorded_jars_come_back_for_the_same_packages_in_any_order(tmp_path: Path) -> None:
    ivy = tmp_path / "ivy2"
    spark_jars = jars(ivy, "a.jar", "b.jar")
    jar_manifest.record_jars(ivy, PACKAGES, spark_jars)
    assert jar_manifest.recorded_jars(ivy, list(reversed(PACKAGES))) == spark_jars.split(",")


def test_other_packages_or_a_missing_jar_mean_resolving_again(tmp_path: Path) -> None:
    ivy = tmp_path / "ivy2"
    jar_manifest.record_jars(ivy, PACKAGES, jars(ivy, "a.jar", "b.jar"))
    assert jar_manifest.recorded_jars(ivy, [*PACKAGES, "org.example:c_2.13:3.0"]) is None
    (ivy / "jars" / "b.jar").unlink()
    assert jar_manifest.recorded_jars(ivy, PACKAGES) is None


def test_only_jars_under_the_ivy_directory_are_recorded(tmp_path: Path) -> None:
    ivy = tmp_path / "ivy2"
    own = jars(ivy, "a.jar")
    elsewhere = tmp_path / "user.jar"
    elsewhere.write_bytes(b"PK")
    jar_manifest.record_jars(ivy, PACKAGES, f"{own},file://{elsewhere}")
    assert jar_manifest.recorded_jars(ivy, PACKAGES) == [own]


def test_nothing_resolved_records_nothing(tmp_path: Path) -> None:
    ivy = tmp_path / "ivy2"
    ivy.mkdir()
    jar_manifest.record_jars(ivy, PACKAGES, "")
    assert not list(ivy.iterdir())
    assert jar_manifest.recorded_jars(ivy, PACKAGES) is None


def test_a_torn_or_foreign_manifest_is_ignored(tmp_path: Path) -> None:
    ivy = tmp_path / "ivy2"
    ivy.mkdir()
    jar_manifest.manifest_path(ivy, PACKAGES).write_text("something else\n/x.jar\n")
    assert jar_manifest.recorded_jars(ivy, PACKAGES) is None


def test_a_read_only_cache_is_not_an_error(tmp_path: Path) -> None:
    ivy = tmp_path / "missing" / "ivy2"  # cannot be written: its parent does not exist
    jar_manifest.record_jars(ivy, PACKAGES, f"file://{ivy}/jars/a.jar")
    assert jar_manifest.recorded_jars(ivy, PACKAGES) is None
