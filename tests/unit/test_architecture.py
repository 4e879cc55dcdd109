"""The package arrows and the house style are checked by the test command, not by review:
import-linter's contracts (pyproject.toml: schemas imports neither side, the consumer never
imports the producer, the producer never imports the consumer or Spark, the consumer's metrics
never import its batch), and ruff's format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / tool), *args], cwd=ROOT, text=True, capture_output=True, timeout=300
    )


def test_import_contracts_are_kept() -> None:
    result = run("lint-imports", "--no-cache")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_code_is_ruff_formatted() -> None:
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
