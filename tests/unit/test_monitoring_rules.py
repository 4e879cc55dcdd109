"""The alert rules pass `promtool check rules`, their unit tests pass `promtool test rules`, every
alert is tested firing and quiet, and every runbook link leads to a section of docs/runbooks.md.
promtool is the real tool, built once at a pinned version by deploy/monitoring/install-promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "alerts.rules.yml"
TESTS = MONITORING / "alerts.test.yml"


@pytest.fixture(scope="session")
def promtool() -> Path:
    proc = subprocess.run(
        [str(MONITORING / "install-promtool")], text=True, capture_output=True, timeout=1800
    )
    if proc.returncode != 0:
        pytest.fail(f"install-promtool failed:\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def run(promtool: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *map(str, args)], text=True, capture_output=True, timeout=120
    )


def alerts() -> list[dict[str, Any]]:
    rules = yaml.safe_load(RULES.read_text())
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def test_rules_pass_promtool_check(promtool: Path) -> None:
    proc = run(promtool, "check", "rules", RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout + proc.stderr


def test_rule_unit_tests_pass(promtool: Path) -> None:
    proc = run(promtool, "test", "rules", TESTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_wrong_expectation_fails_the_rule_tests(promtool: Path, tmp_path: Path) -> None:
    """The promtool run can fail: a quiet case made to expect an alert is reported."""
    shutil.copy(RULES, tmp_path / RULES.name)
    tests = yaml.safe_load(TESTS.read_text())
    quarantine = next(t for t in tests["tests"] if t["name"] == "quarantine")
    quarantine["alert_rule_test"][-1]["exp_alerts"] = [
        {"exp_labels": {"severity": "warning", "job": "consumer", "instance": "b"}}
    ]
    broken = tmp_path / TESTS.name
    broken.write_text(yaml.safe_dump(tests))
    proc = run(promtool, "test", "rules", broken)
    assert proc.returncode != 0
    assert "WalbridgeQuarantineNotEmpty" in proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    tests = yaml.safe_load(TESTS.read_text())
    cases = [case for test in tests["tests"] for case in test["alert_rule_test"]]
    for alert in alerts():
        mine = [c for c in cases if c["alertname"] == alert["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{alert['alert']}: no firing case"
        assert any(not c["exp_alerts"] for c in mine), f"{alert['alert']}: no quiet case"


def anchors(markdown: str) -> set[str]:
    """Heading anchors as GitHub and MkDocs make them: lower case, punctuation dropped,
    spaces to hyphens."""
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-")
        found.add(slug)
    return found


def test_every_alert_has_a_severity_summary_and_runbook_section() -> None:
    sections = anchors((ROOT / "docs" / "runbooks.md").read_text())
    for alert in alerts():
        assert alert["labels"]["severity"] in {"warning", "critical"}, alert["alert"]
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
        path, _, anchor = alert["annotations"]["runbook"].partition("#")
        assert path == "docs/runbooks.md", alert["alert"]
        assert anchor in sections, f"{alert['alert']}: no section #{anchor} in docs/runbooks.md"
