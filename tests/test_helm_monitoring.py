"""The monitoring the chart ships, rendered with the real Helm engine: PodMonitors for the operator
and the readers, the opt-in PrometheusRule and the Grafana dashboard.

What ``promtool check rules`` would check, with the PromQL parser of PyPI ``promql-parser`` (a port
of Prometheus' own): every expression parses; every alert has a severity, a summary and a runbook
link to its section of the documentation's operations page (that the anchor exists in the built
site is tests/test_docs.py's). Every metric a rule or a dashboard query reads
is one lakeslot defines (the operator's and the reader's registries); tests/test_operator_metrics.py
checks the same names in real scrapes, and every alert fires on scraped values in a test that
creates its condition (there, tests/test_local_metrics.py and tests/test_alert_reader_restarting.py).
"""

from __future__ import annotations

import re

import pytest

from lakeslot.observability.metrics import GAUGES, PREFIX
from lakeslot.reader.metrics import Metrics
from lakeslot_operator import children
from lakeslot_operator.metrics import OperatorMetrics
from tests.support import chart, promql

MONITORING = chart.VALUE_SETS["monitoring"]
ALERTS = {"LakeslotWalRetainedHigh", "LakeslotWalRetainedGrowing", "LakeslotWalUnreserved",
          "LakeslotSlotInactive", "LakeslotFreshnessHigh", "LakeslotNotReady", "LakeslotTableFailed",
          "LakeslotDefiniteError", "LakeslotReaderRestarting"}


def _defined() -> set[str]:
    """Every sample name lakeslot's registries can export (the operator's gauges are collected on
    demand, so their names come from their table)."""
    operator = OperatorMetrics()
    operator.observe("ns", "i", {}, suspended=False, events=[])
    with operator.reconciling("ns", "i"):
        pass
    names = {s.name for m in operator.registry.collect() for s in m.samples}
    reader = Metrics()
    reader.changes.labels("I").inc()
    names |= {s.name for m in reader.registry.collect() for s in m.samples}
    return names | {PREFIX + g for g in GAUGES}


def test_monitoring_is_opt_in():
    kinds = {m["kind"] for m in chart.render(chart.SERVED)}
    assert not kinds & {"PodMonitor", "PrometheusRule", "ConfigMap"}


def test_every_alert_parses_reads_lakeslot_metrics_and_links_its_runbook():
    rules = chart.alert_rules(chart.render(MONITORING))
    assert set(rules) == ALERTS
    defined = _defined()
    runbook = "https://lakeslot.github.io/lakeslot/operations/#"
    for name, rule in rules.items():
        read = promql.metrics(rule["expr"])  # parses, or raises like promtool would
        assert read and read <= defined, (name, read - defined)
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert "{{ $labels.ingestion }}" in rule["annotations"]["summary"], name
        link = rule["annotations"]["runbook_url"]
        assert link == runbook + name.lower(), (name, link)


def test_thresholds_come_from_the_values():
    values = {**chart.SERVED, "metrics": {"prometheusRule": {
        "enabled": True, "walRetainedBytes": 123456789012, "freshnessSeconds": 42, "walGrowingMinutes": 7,
        "notReadyMinutes": 9, "slotInactiveMinutes": 3, "readerRestarts": 5,
        "runbookUrl": "https://wiki.example/lakeslot"}}}
    rules = chart.alert_rules(chart.render(values))
    assert rules["LakeslotWalRetainedHigh"]["expr"].endswith("> 123456789012")
    assert rules["LakeslotFreshnessHigh"]["expr"].endswith("> 42")
    assert "[7m]" in rules["LakeslotWalRetainedGrowing"]["expr"] and rules["LakeslotWalRetainedGrowing"]["for"] == "7m"
    assert rules["LakeslotNotReady"]["for"] == "9m" and rules["LakeslotSlotInactive"]["for"] == "3m"
    assert rules["LakeslotReaderRestarting"]["expr"].endswith("> 5")
    assert rules["LakeslotTableFailed"]["annotations"]["runbook_url"] == "https://wiki.example/lakeslot#lakeslottablefailed"


def test_a_broken_expression_is_refused_by_the_parser():
    with pytest.raises(ValueError, match="unclosed left parenthesis"):
        promql.parse("max by (namespace (lakeslot_slot_active) == 0")


def test_the_dashboard_has_a_row_per_ingestion_and_per_table_reading_lakeslot_metrics():
    manifests = chart.render(MONITORING)
    config_map = chart.one(manifests, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    board = chart.dashboard(manifests)
    rows = {p["repeat"]: p for p in board["panels"] if p["type"] == "row"}
    assert set(rows) == {"ingestion", "table"}
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "namespace", "ingestion", "table"}
    defined = _defined()
    queries = chart.dashboard_queries(board)
    assert len(queries) > 10
    for query in queries:
        read = promql.metrics(query)
        assert read and read <= defined, (query, read - defined)
    for panel in board["panels"]:
        assert panel["type"] == "row" or panel["targets"], panel["title"]


@pytest.mark.parametrize("name", ["monitoring", "namespaced"])
def test_the_operator_pod_monitor_scrapes_the_port_the_operator_serves(name):
    values = {**chart.VALUE_SETS[name], "metrics": {"podMonitor": {"enabled": True}}}
    manifests = chart.render(values)
    monitors = {m["metadata"]["name"].rsplit("-", 1)[1]: m for m in chart.of_kind(manifests, "PodMonitor")}
    assert set(monitors) == {"operator", "readers"}
    operator = monitors["operator"]
    pod = chart.one(manifests, "Deployment")["spec"]["template"]
    assert operator["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert operator["spec"]["namespaceSelector"] == {"matchNames": [chart.RELEASE_NAMESPACE]}
    (endpoint,) = operator["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True  # the series' namespace is the ingestion's, not the pod's
    (port,) = [p for p in chart.operator_container(manifests)["ports"] if p["name"] == endpoint["port"]]
    args = chart.operator_container(manifests)["args"]
    assert args[args.index("--metrics-port") + 1] == str(port["containerPort"])
    # The readers' series are labelled with the ingestion their pod serves.
    (reader,) = monitors["readers"]["spec"]["podMetricsEndpoints"]
    label = re.sub(r"[^a-zA-Z0-9_]", "_", children.INGESTION_LABEL)
    assert {"sourceLabels": [f"__meta_kubernetes_pod_label_{label}"], "targetLabel": "ingestion"} in \
        reader["relabelings"]


def test_without_a_metrics_port_there_is_no_operator_pod_monitor():
    manifests = chart.render(chart.VALUE_SETS["no-metrics"])
    assert [m["metadata"]["name"] for m in chart.of_kind(manifests, "PodMonitor")] == ["lakeslot-readers"]
    assert "metrics" not in {p["name"] for p in chart.operator_container(manifests)["ports"]}
