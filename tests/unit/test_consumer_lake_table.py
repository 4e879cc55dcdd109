"""Decisions merge.py and merge_target.py take from a table's state (lake_state.LakeTable),
without Spark."""

from __future__ import annotations

from typing import Any, cast

import pytest

from spark_consumer import merge, merge_target
from spark_consumer.errors import ApplyError
from spark_consumer.lake_state import DELETION_VECTORS, NO_TABLE, LakeTable

MISSING = LakeTable("/lake/s/t", NO_TABLE)


def table(files: int = 3, **props: str) -> LakeTable:
    return LakeTable("/lake/s/t", 7, properties=props, files=files)


def changes(lake: LakeTable, **kw: Any) -> merge.TableChanges:
    # The decisions below never look at the changes themselves.
    return merge.TableChanges(
        "s", "t", lake.path, ("id",), ("id", "v"), cast(Any, None), lake=lake, **kw
    )


def test_stored_key_comes_from_the_property() -> None:
    assert merge_target.stored_key(MISSING) is None
    assert merge_target.stored_key(table(**{merge_target.KEY_PROPERTY: "a,b"})) == ("a", "b")
    assert merge_target.stored_key(table(**{merge_target.KEY_PROPERTY: ""})) == ()  # append-only
    assert merge_target.stored_key(table()) == ()


def test_deletion_vector_mode_must_match_the_setting() -> None:
    merge_target.check_deletion_vectors("s.t", MISSING, True)  # created in the wanted mode
    merge_target.check_deletion_vectors("s.t", table(**{DELETION_VECTORS: "true"}), True)
    merge_target.check_deletion_vectors("s.t", table(), False)
    with pytest.raises(
        ApplyError, match=r"table s\.t: .*enableDeletionVectors=false.*SET TBLPROPERTIES"
    ):
        merge_target.check_deletion_vectors("s.t", table(), True)
    with pytest.raises(ApplyError, match="DROP FEATURE deletionVectors"):
        merge_target.check_deletion_vectors("s.t", table(**{DELETION_VECTORS: "TRUE"}), False)


def test_only_small_tables_with_deletion_vectors_rewrite() -> None:
    dv = {DELETION_VECTORS: "true"}
    small = LakeTable("/lake/s/t", 7, properties=dv, files=2, size=1000)
    assert merge_target.rewrites(small, below_bytes=1001)
    assert not merge_target.rewrites(small, below_bytes=1000)  # not smaller
    assert not merge_target.rewrites(small, below_bytes=0)  # 0: always deletion vectors
    plain = LakeTable("/lake/s/t", 7, files=2, size=1000)
    assert not merge_target.rewrites(plain, below_bytes=1001)  # rewrites anyway: nothing to switch
    assert not merge_target.rewrites(MISSING, below_bytes=1001)


def test_append_needs_the_recorded_version_or_no_table() -> None:
    assert merge._append_applies(cast(Any, None), changes(MISSING, unique_key=True))
    assert merge._append_applies(
        cast(Any, None), changes(table(), unique_key=True, recorded_version=7)
    )
    # Moved on since the last progress row (a crashed run committed): the guarded MERGE.
    assert not merge._append_applies(
        cast(Any, None), changes(table(), unique_key=True, recorded_version=6)
    )
    assert not merge._append_applies(cast(Any, None), changes(table(), unique_key=True))
    assert not merge._append_applies(cast(Any, None), changes(MISSING, unique_key=False))


def test_keyless_append_needs_the_recorded_version_and_no_truncate() -> None:
    def keyless(lake: LakeTable, **kw: Any) -> merge.TableChanges:
        return merge.TableChanges("s", "t", lake.path, (), ("v",), cast(Any, None), lake=lake, **kw)

    assert merge._keyless_append_applies(cast(Any, None), keyless(MISSING))
    assert merge._keyless_append_applies(cast(Any, None), keyless(table(), recorded_version=7))
    # Moved on since the last progress row (a crashed run committed), or never recorded.
    assert not merge._keyless_append_applies(cast(Any, None), keyless(table(), recorded_version=6))
    assert not merge._keyless_append_applies(cast(Any, None), keyless(table()))
    # A truncate deletes target rows first.
    assert not merge._keyless_append_applies(
        cast(Any, None), keyless(table(), recorded_version=7, truncate=(5, 1))
    )


def test_empty_target_is_a_table_without_files() -> None:
    assert merge._empty_target_applies(cast(Any, None), changes(MISSING))
    assert merge._empty_target_applies(cast(Any, None), changes(table(files=0)))
    assert not merge._empty_target_applies(cast(Any, None), changes(table(files=1)))
    # Unchanged TOAST values need the MERGE's check of their target rows.
    assert not merge._empty_target_applies(
        cast(Any, None), changes(MISSING, toast_columns=frozenset({"v"}))
    )
