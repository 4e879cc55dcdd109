"""schemas.settings is the one list of WALBRIDGE_* variables: every tool's declarations, and
every variable named anywhere in the code or the stack scripts, are in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from producer.config import ProducerConfig
from producer.snapshot.signal import SnapshotRequest
from schemas import settings
from schemas.settings_loader import declared
from spark_consumer.config import ConsumerConfig, MaintainConfig, SparkSettings, VerifyConfig

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bWALBRIDGE_[A-Z0-9_]*[A-Z0-9]\b")


def _variables(*classes: type) -> set[str]:
    return {s.env for cls in classes for s in declared(cls)}


def test_the_producer_declares_exactly_its_listed_variables() -> None:
    assert _variables(ProducerConfig, SnapshotRequest) == settings.PRODUCER


def test_the_consumer_declares_exactly_its_listed_variables() -> None:
    assert (
        _variables(ConsumerConfig, VerifyConfig, MaintainConfig, SparkSettings) == settings.CONSUMER
    )


def test_every_variable_the_code_and_scripts_name_is_listed() -> None:
    files = [
        *ROOT.glob("producer/**/*.py"),
        *ROOT.glob("schemas/**/*.py"),
        *ROOT.glob("spark_consumer/**/*.py"),
        *(ROOT / "deploy" / "local").rglob("*"),
    ]
    named = {m for f in files if f.is_file() for m in NAME.findall(f.read_text(errors="replace"))}
    # WALBRIDGE_X_Y: the help texts' placeholder for "any setting".
    assert named - settings.ALL - {"WALBRIDGE_X_Y"} == set()


def test_unknown_names_are_reported_sorted() -> None:
    env = {"WALBRIDGE_LAKEPATH": "x", "WALBRIDGE_SLOT": "s", "PATH": "/bin", "WALBRIDGE_A": "1"}
    assert settings.unknown(env) == ["WALBRIDGE_A", "WALBRIDGE_LAKEPATH"]
