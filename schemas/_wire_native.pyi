# Type stub of the C extension schemas/_wire_native.c (see schemas/native_encoder.py).
from collections.abc import Callable
from typing import Final

OP_CALL: Final[int]
OP_TEXT: Final[int]
OP_RAW: Final[int]
OP_JSONB_BIN: Final[int]
OP_INT_TEXT: Final[int]
OP_INT2_BIN: Final[int]
OP_INT4_BIN: Final[int]
OP_INT8_BIN: Final[int]
OP_OID_BIN: Final[int]
OP_BOOL_TEXT: Final[int]
OP_BOOL_BIN: Final[int]
OP_FLOAT8_BIN: Final[int]
OP_NUMERIC_TEXT: Final[int]
OP_TEXT_ARRAY: Final[int]
OP_TIMESTAMPTZ_TEXT: Final[int]
OP_TIMESTAMP_TEXT: Final[int]

# One column's plan for one wire format: (operation, union branch prefix, argument, fallback).
Plan = tuple[int, bytes, int, Callable[[bytes], bytes]]

class TupleEncoder:
    def __init__(
        self,
        columns: tuple[tuple[str, bool, Plan, Plan], ...],
        key_order: tuple[int, ...] | None,
        failures: tuple[type[BaseException], ...],
    ) -> None: ...
    def __call__(
        self, buf: bytes | memoryview, pos: int, /
    ) -> tuple[bytes, list[str], bytes | None, int] | None: ...
    @property
    def width(self) -> int: ...
    @property
    def ops(self) -> tuple[tuple[int, int], ...]: ...
    def copy_twin(
        self, slow: Callable[[bytes], tuple[bytes, bytes | None] | None], /
    ) -> CopyEncoder: ...

class CopyEncoder:
    def __call__(self, line: bytes, /) -> tuple[bytes, bytes | None] | None: ...
