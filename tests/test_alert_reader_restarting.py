"""The chart's ``LakeslotReaderRestarting`` alert fires when a reader keeps restarting: a real
``lakeslot reader`` process against PostgreSQL 18, killed and started again in the same pod (as
the kubelet restarts a crashing container), scraped after each start.

Simulated, because no Prometheus runs here: the scrape's target labels. Each sample gets the
labels the chart's reader PodMonitor gives it — its relabelings applied to the pod's labels as
Prometheus would (``__meta_kubernetes_pod_label_*``, action ``replace``), plus the ``namespace``
and ``pod`` target labels the Prometheus Operator adds — and the alert's expression is evaluated
over the scrapes with their times (:mod:`tests.support.promql`).
"""

from __future__ import annotations

import re
import signal
import time
import urllib.error

import pytest

from lakeslot.api.naming import TableName
from lakeslot.local.pgcluster import free_port
from lakeslot_operator import children
from tests.support import chart, promql
from tests.support.prometheus import Scrape, scrape
from tests.support.reader_support import APP_NAME, INGESTION, POD, holder, prepare, spawn
from tests.support.waiting import wait_for

RESTARTS = 1  # the alert's threshold: more restarts than this within 30 minutes


def _pod_monitor_labels(rules: list[dict], pod_labels: dict[str, str]) -> dict[str, str]:
    """The labels the relabelings give a target: each ``replace`` of one source label."""
    meta = {f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', k)}": v
            for k, v in pod_labels.items()}
    labels = {}
    for rule in rules:
        assert rule.get("action", "replace") == "replace" and len(rule["sourceLabels"]) == 1, rule
        labels[rule["targetLabel"]] = meta[rule["sourceLabels"][0]]
    return labels


@pytest.mark.parametrize("pg", ["pg18"], indirect=True)
def test_a_reader_restarting_more_than_the_threshold_fires_the_alert(pgdb, tmp_path):
    values = {**chart.SERVED, "metrics": {"podMonitor": {"enabled": True},
                                          "prometheusRule": {"enabled": True, "readerRestarts": RESTARTS}}}
    manifests = chart.render(values)
    alert = chart.alert_rules(manifests)["LakeslotReaderRestarting"]
    (monitor,) = [m for m in chart.of_kind(manifests, "PodMonitor") if m["metadata"]["name"].endswith("-readers")]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    namespace, name = INGESTION.split("/")
    target = {"namespace": namespace, "pod": POD,
              **_pod_monitor_labels(endpoint["relabelings"], {children.INGESTION_LABEL: name})}
    expected = frozenset({("namespace", namespace), ("ingestion", name)})
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    timeline = promql.Timeline()

    def scraped() -> Scrape:
        try:
            result = scrape(url)
        except urllib.error.URLError:
            return Scrape()  # not serving yet
        return Scrape({(n, labels | frozenset(target.items())): v for (n, labels), v in result.items()})

    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        prepare(conn, [TableName("public", "t")])
        for start in range(RESTARTS + 2):
            reader = spawn(pgdb, (tmp_path / "staging").as_uri(), tmp_path / "reader.log",
                           "--metrics-port", str(port))
            try:
                result = wait_for(scraped, "the reader's metrics")
                timeline.take(result, time.time())
                firing = promql.evaluate(alert["expr"], timeline)
                assert firing == ({expected: float(start)} if start > RESTARTS else {}), (start, firing)
                wait_for(lambda: holder(conn) == APP_NAME, "the reader to hold the slot")
            finally:
                reader.send_signal(signal.SIGKILL)  # a crash: the kubelet starts the container again
                reader.wait()
    started = [r.value("lakeslot_reader_start_time_seconds") for _, r in timeline]
    assert len(set(started)) == len(started) == RESTARTS + 2  # each start a new value
