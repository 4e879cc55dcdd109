"""The driver hands freed memory back between batches (freed_memory.py)."""

from __future__ import annotations

import platform

import pytest

from spark_consumer import freed_memory

pytestmark = pytest.mark.unit


def test_release_calls_malloc_trim_where_the_c_library_is_glibc() -> None:
    assert freed_memory.release() is (platform.libc_ver()[0] == "glibc")
