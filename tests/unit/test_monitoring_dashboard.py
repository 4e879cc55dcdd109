"""The Grafana dashboard and the alert rules name only metrics the code exports (a renamed
metric fails here), every exported metric has a panel, and the dashboard imports anywhere
(its data source is a variable)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.metric_names import (
    dashboard_queries,
    exported_families,
    exported_names,
    referenced_names,
    rule_expressions,
    unknown_names,
)

pytestmark = pytest.mark.unit

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MONITORING / "walbridge-dashboard.json").read_text())
    return loaded


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((MONITORING / "alerts.rules.yml").read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows included; rows themselves left out."""
    found = []
    for panel in dashboard["panels"]:
        found.extend(panel.get("panels", []))
        if panel["type"] != "row":
            found.append(panel)
    return found


def test_dashboard_and_rules_name_only_exported_metrics(
    dashboard: dict[str, Any], rules: dict[str, Any]
) -> None:
    queries = dashboard_queries(dashboard)
    expressions = rule_expressions(rules)
    # The scan found something to check in both files.
    assert len(queries) > 30 and len(expressions) >= 10
    assert unknown_names(queries + expressions, exported_names()) == {}


def test_every_exported_metric_has_a_panel(dashboard: dict[str, Any]) -> None:
    used = set().union(*(referenced_names(q) for q in dashboard_queries(dashboard)))
    without = sorted(name for name, samples in exported_families().items() if not samples & used)
    assert without == []


def test_the_name_check_reports_what_the_code_does_not_export() -> None:
    known = exported_names()
    # The counter's family name without prometheus_client's `_total`, a histogram named without
    # `_bucket`, and a made-up name; label values that look like metric names are not names.
    exprs = [
        'rate(walbridge_events{table="walbridge_cdc"}[5m])',
        "histogram_quantile(0.99, rate(walbridge_consumer_batch_seconds[5m]))",
        "walbridge_slot_lag_bytez > 0 and walbridge_slot_lag_bytes > 0",
        'walbridge_slot_wal_status{status=~"lost|walbridge_missing"} == 1',
    ]
    assert unknown_names(exprs, known) == {
        "walbridge_events": [exprs[0]],
        "walbridge_consumer_batch_seconds": [exprs[1]],
        "walbridge_slot_lag_bytez": [exprs[2]],
    }


def test_exported_names_follow_prometheus_client_suffixes() -> None:
    names = exported_names()
    assert {"walbridge_events_total", "walbridge_slot_lag_bytes"} <= names
    assert {
        "walbridge_consumer_batch_seconds_bucket",
        "walbridge_kafka_commit_seconds_count",
    } <= names
    assert "walbridge_events" not in names and "walbridge_consumer_batch_seconds" not in names


def test_dashboard_takes_its_data_source_from_a_variable(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for panel in panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


def test_dashboard_panels_have_unique_ids_and_fit_the_grid(dashboard: dict[str, Any]) -> None:
    every = dashboard["panels"] + [p for row in dashboard["panels"] for p in row.get("panels", [])]
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in every:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
    for p in panels(dashboard):
        assert p["description"] and p["targets"], p["title"]
