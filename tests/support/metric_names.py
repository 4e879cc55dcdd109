"""The metric names the code exports, the ones PromQL expressions refer to, and the difference:
so a dashboard or an alert that names a metric the code no longer exports fails a test.

Pure but for ``exported_names``, which instantiates the producer's and the consumer's metrics on
a fresh registry (no server, no Spark).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from producer.metrics import Metrics
from spark_consumer.metrics import ConsumerMetrics

# Our metrics all start with this prefix; label names and PromQL's own words never do, so a
# tolerant scan for it finds every metric name without parsing PromQL.
_METRIC = re.compile(r"(?<![A-Za-z0-9_:$])walbridge_[A-Za-z0-9_:]*")
# String literals (label values, regexes) and range/offset durations may hold anything.
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')

# The sample names prometheus_client writes for each family type (its exposition format adds
# `_total` to counters and `_bucket`/`_sum`/`_count` to histograms; `_created` where enabled).
_SUFFIXES: Mapping[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "unknown": ("",),
}


def exported_families() -> dict[str, set[str]]:
    """Each metric family of the producer and the consumer, with the sample names its
    /metrics shows (labelled families have no sample before their first use: named by type)."""
    registry = CollectorRegistry()
    Metrics(registry)
    ConsumerMetrics(registry)
    return {
        family.name: {family.name + suffix for suffix in _SUFFIXES[family.type]}
        for family in registry.collect()
    }


def exported_names() -> set[str]:
    """Every sample name the producer's and the consumer's /metrics can show."""
    return set().union(*exported_families().values())


def referenced_names(expr: str) -> set[str]:
    """The walbridge metric names a PromQL expression (or a Grafana query) refers to."""
    return set(_METRIC.findall(_QUOTED.sub('""', expr)))


def unknown_names(exprs: Iterable[str], known: set[str]) -> dict[str, list[str]]:
    """Each referenced name missing from ``known``, with the expressions that use it."""
    missing: dict[str, list[str]] = {}
    for expr in exprs:
        for name in sorted(referenced_names(expr) - known):
            missing.setdefault(name, []).append(expr)
    return missing


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[str]:
    """Every PromQL text of a Grafana dashboard: panel targets (rows and nested panels
    included) and template variable queries."""
    queries = list(_values_of(dashboard.get("panels", []), "expr"))
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        if isinstance(query, Mapping):  # newer Grafana: {"query": "...", "refId": ...}
            query = query.get("query")
        if isinstance(query, str):
            queries.append(query)
        if isinstance(variable.get("definition"), str):
            queries.append(variable["definition"])
    return queries


def rule_expressions(rules: Mapping[str, Any]) -> list[str]:
    """The `expr` of every rule in a Prometheus rule file."""
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def _values_of(node: Any, key: str) -> Iterator[str]:
    if isinstance(node, Mapping):
        for k, v in node.items():
            if k == key and isinstance(v, str):
                yield v
            else:
                yield from _values_of(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from _values_of(item, key)
