"""The Kubernetes manifests: rendered by kustomize and validated by kubeconform against the
Kubernetes schemas (deploy/kubernetes/check), a broken manifest fails that check, the producer
pod keeps the rules a replication slot needs, and spark-submit runs the same application as the
SparkApplication.

The first run builds kustomize and kubeconform with `go install` (cached under the downloads
directory afterwards).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas import settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
CHECK = KUBERNETES / "check"


def check(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), *map(str, args)], text=True, capture_output=True, timeout=900
    )


def render(directory: Path) -> list[dict[str, Any]]:
    proc = check("--render-only", directory)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def example() -> list[dict[str, Any]]:
    return render(KUBERNETES / "overlays" / "example")


def test_every_kustomization_validates() -> None:
    proc = check()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summaries = [line for line in proc.stdout.splitlines() if "Summary:" in line]
    # base and the example overlay, each against two Kubernetes versions
    assert len(summaries) == 4, proc.stdout
    for line in summaries:
        assert "Valid: 11, Invalid: 0, Errors: 0, Skipped: 0" in line, line


def test_a_broken_manifest_fails_the_check(tmp_path: Path) -> None:
    copy = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, copy)
    statefulset = copy / "base" / "producer" / "statefulset.yaml"
    statefulset.write_text(
        statefulset.read_text().replace(
            "terminationGracePeriodSeconds: 45", "terminationGracePeriod: 45"
        )
    )
    application = copy / "base" / "consumer" / "sparkapplication.yaml"
    application.write_text(application.read_text().replace("instances: 2", 'instances: "two"'))
    proc = check(copy / "base", "--kubernetes-version", "1.33.0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Invalid: 2" in proc.stdout, proc.stdout
    assert "'terminationGracePeriod' not allowed" in proc.stderr, proc.stderr
    assert "/spec/executor/instances" in proc.stderr, proc.stderr


def test_producer_pod_is_one_per_slot_with_probes_and_secrets(
    example: list[dict[str, Any]],
) -> None:
    statefulset = one(example, "StatefulSet", "walbridge-producer")
    config = one(example, "ConfigMap", "walbridge-producer")["data"]
    spec = statefulset["spec"]
    assert spec["replicas"] == 1
    pod = spec["template"]["spec"]
    # A Service named walbridge-producer would inject WALBRIDGE_PRODUCER_* variables otherwise.
    assert pod["enableServiceLinks"] is False
    assert pod["terminationGracePeriodSeconds"] > float(config["WALBRIDGE_SHUTDOWN_GRACE_S"])
    (container,) = pod["containers"]
    port = container["ports"][0]
    assert port["containerPort"] == int(config["WALBRIDGE_METRICS_PORT"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    env = {e["name"]: e for e in container["env"]}
    assert env["WALBRIDGE_PG_DSN"]["valueFrom"]["secretKeyRef"]["name"] == "walbridge-producer"
    assert all("value" not in e for e in container["env"]), "secrets must not be literals"
    # Every variable the pod sets is one the producer knows (it refuses the others as typos).
    names = set(config) | set(env)
    assert {n for n in names if n.startswith("WALBRIDGE_")} <= settings.PRODUCER
    pdb = one(example, "PodDisruptionBudget", "walbridge-producer")
    labels = spec["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one(example, "Service", "walbridge-producer")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["metadata"]["annotations"]["prometheus.io/port"] == str(port["containerPort"])


def test_consumer_settings_are_the_consumers_and_on_object_storage(
    example: list[dict[str, Any]],
) -> None:
    config = one(example, "ConfigMap", "walbridge-consumer")["data"]
    assert {n for n in config if n.startswith("WALBRIDGE_")} <= settings.CONSUMER
    assert config["WALBRIDGE_LAKE_PATH"].startswith("s3a://")
    assert config["WALBRIDGE_CHECKPOINT_PATH"].startswith("s3a://")
    application = one(example, "SparkApplication", "walbridge-consumer")["spec"]
    assert application["image"].endswith("walbridge-consumer:0.1.0")
    driver_labels = application["driver"]["labels"]
    service = one(example, "Service", "walbridge-consumer-metrics")
    assert service["spec"]["selector"].items() <= driver_labels.items()
    port = str(application["driver"]["ports"][0]["containerPort"])
    assert port == config["WALBRIDGE_CONSUMER_METRICS_PORT"]
    assert service["metadata"]["annotations"]["prometheus.io/port"] == port


def test_spark_submit_runs_the_same_application(tmp_path: Path) -> None:
    """deploy/kubernetes/spark-submit, with a stand-in spark-submit that records its arguments."""
    recorder = tmp_path / "spark-submit"
    recorder.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$0.args"\n')
    recorder.chmod(0o755)
    (base,) = [
        o for o in render(KUBERNETES / "base") if o["kind"] == "SparkApplication"
    ]  # fmt: skip
    config = one(render(KUBERNETES / "base"), "ConfigMap", "walbridge-consumer")["data"]
    application = base["spec"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WALBRIDGE_", "AWS_"))}
    env |= {k: v for k, v in config.items() if v} | {
        "K8S_API": "https://kube.example:6443",
        "IMAGE": application["image"],
        "SPARK_SUBMIT": str(recorder),
    }
    proc = subprocess.run(
        [str(KUBERNETES / "spark-submit")], env=env, text=True, capture_output=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    args = (tmp_path / "spark-submit.args").read_text().splitlines()
    assert args[:4] == ["--master", "k8s://https://kube.example:6443", "--deploy-mode", "cluster"]
    assert args[-2:] == [application["mainApplicationFile"], *application["arguments"]]
    conf = dict(
        a.split("=", 1) for a, flag in zip(args[1:], args, strict=False) if flag == "--conf"
    )
    assert conf["spark.kubernetes.container.image"] == application["image"]
    assert all(conf[key] == value for key, value in application["sparkConf"].items())
    driver, executor = application["driver"], application["executor"]
    assert (
        conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == driver["serviceAccount"]
    )
    assert conf["spark.driver.cores"] == str(driver["cores"])
    assert conf["spark.driver.memory"] == driver["memory"]
    assert conf["spark.executor.instances"] == str(executor["instances"])
    assert conf["spark.executor.cores"] == str(executor["cores"])
    assert conf["spark.executor.memory"] == executor["memory"]
    assert conf["spark.executor.memoryOverhead"] == executor["memoryOverhead"]
    for name, value in config.items():
        if value:
            assert conf[f"spark.kubernetes.driverEnv.{name}"] == value
            assert conf[f"spark.executorEnv.{name}"] == value
    for item in driver["env"]:
        ref = item["valueFrom"]["secretKeyRef"]
        expected = f"{ref['name']}:{ref['key']}"
        assert conf[f"spark.kubernetes.driver.secretKeyRef.{item['name']}"] == expected
        assert conf[f"spark.kubernetes.executor.secretKeyRef.{item['name']}"] == expected
