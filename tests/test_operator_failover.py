"""More than one operator replica, as the chart runs them, on the Kubernetes API emulator: exactly
one reconciles, killing it hands over to another within a bounded time, and a rolling update
never leaves no replica acting.

Each replica is the real ``lakeslot operator`` process with the arguments and environment of the
chart's Deployment (``replicaCount: 2``), its own pod name (kopf's identity) and its own recording
proxy in front of the emulator, so the requests of each replica are told apart: a replica
reconciled an ingestion when it patched it (kopf's finalizer and progress, the status). The
ingestions name a Secret that does not exist, so each reconcile ends in a status (``SourceReady:
SecretNotFound``) without a database.

Simulated (nothing schedules pods here): the Deployment controller's rollout — the test starts the
new pod, then stops the old one (``maxUnavailable: 0``), and kills a pod with SIGKILL for a crash.
The keep-alive lifetime is shortened to 5 s (``LAKESLOT_PEERING_LIFETIME_S``) so the failover wait
stays short; the wait is bounded generously, never asserted as a duration.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import kubernetes.client
import pytest

from lakeslot.api.models import GROUP, PLURAL, VERSION
from lakeslot_operator import peering
from tests.api_cases import apply_edits, base_document
from tests.support import chart
from tests.support.kube_emulator import KubeEmulator, write_kubeconfig
from tests.support.prometheus import scrape
from tests.support.rbac import RecordingProxy
from tests.support.waiting import wait_for
from tests.test_helm_operator import NAMESPACE, free_port, install, liveness, process_environment

VALUES = {**chart.SERVED, "replicaCount": 2}
LIFETIME_S = 5
FAILOVER_DEADLINE_S = 120.0  # a bound on a hang: the lifetime plus kopf's re-check, with room
EQUAL_PRIORITIES = "Pausing all operators, including self"
PAUSED = "Pausing operations in favour of"


@dataclass
class Replica:
    pod: str
    process: subprocess.Popen
    proxy: RecordingProxy
    log: Path
    metrics: str  # its /metrics

    def reports(self, name: str) -> bool:
        """Whether its metrics have series of the ingestion ``name``."""
        return any(("ingestion", name) in labels for _, labels in scrape(self.metrics))

    def reconciled(self, name: str) -> bool:
        return any(method == "PATCH" and path.endswith((f"/{PLURAL}/{name}", f"/{PLURAL}/{name}/status"))
                   for method, path, _ in list(self.proxy.requests))

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def replica(kube: KubeEmulator, tmp_path: Path, pod: str) -> Iterator[Replica]:
    port = free_port()
    # Each replica on ports of its own: they share this machine, not a pod network.
    metrics = free_port()
    manifests = chart.render({**VALUES, "livenessPort": port, "metrics": {"port": metrics}})
    container = chart.operator_container(manifests)
    log = tmp_path / f"{pod}.log"
    with RecordingProxy(kube.url) as proxy:
        kubeconfig = write_kubeconfig(proxy.url, tmp_path / f"{pod}.kubeconfig")
        environment = {**process_environment(container, kubeconfig), "POD_ID": pod,
                       "LAKESLOT_PEERING_LIFETIME_S": str(LIFETIME_S)}
        executable = shutil.which(container["command"][0], path=str(Path(sys.executable).parent))
        with log.open("wb") as output:
            process = subprocess.Popen([executable, *container["args"]], stdout=output,
                                       stderr=subprocess.STDOUT, env=environment)
        try:
            wait_for(lambda: process.poll() is not None or liveness(f"http://127.0.0.1:{port}/healthz"),
                     f"{pod}'s liveness endpoint")
            assert process.poll() is None, log.read_text()
            yield Replica(pod, process, proxy, log, f"http://127.0.0.1:{metrics}/metrics")
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
            print(f"--- {pod}\n" + log.read_text(errors="replace")[-5000:])  # shown on failure


def peers(api) -> dict:
    peering = kubernetes.client.CustomObjectsApi(api).get_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", chart.RELEASE)
    assert isinstance(peering, dict)
    return peering.get("status") or {}


def create(api, name: str) -> None:
    document = apply_edits(base_document(), (("metadata.name", name), ("metadata.namespace", NAMESPACE)))
    kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                                                            document)


def status_written(api, name: str) -> bool:
    resource = kubernetes.client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, name)
    assert isinstance(resource, dict)
    return any(c["type"] == "SourceReady" and c["reason"] == "SecretNotFound"
               for c in (resource.get("status") or {}).get("conditions", []))


def test_one_replica_acts_a_crash_fails_over_and_a_rollout_never_leaves_none(kube: KubeEmulator, tmp_path):
    with kube.api_client() as api:
        install(api, chart.render(VALUES))
        with replica(kube, tmp_path, "lakeslot-old-a") as a:
            wait_for(lambda: a.pod in peers(api), "the first replica in the peering object")
            with replica(kube, tmp_path, "lakeslot-old-b") as b:
                wait_for(lambda: b.pod in peers(api), "the second replica in the peering object")
                assert peers(api)[a.pod]["priority"] != peers(api)[b.pod]["priority"]
                wait_for(lambda: PAUSED in a.text(), "the older replica to pause for the newer")

                # Exactly one reconciles: the newer one.
                create(api, "one")
                wait_for(lambda: status_written(api, "one"), "ingestion one reconciled")
                assert b.reconciled("one") and not a.reconciled("one")
                wait_for(lambda: b.reports("one"), "the active replica's metrics of ingestion one")
                assert not a.reports("one")  # a paused replica reports nothing of it

                # The active one crashes: the other takes over within a bounded time.
                b.process.send_signal(signal.SIGKILL)
                b.process.wait(30)
                create(api, "two")
                wait_for(lambda: status_written(api, "two"), "the standby to take over after a crash",
                         deadline=FAILOVER_DEADLINE_S)
                assert a.reconciled("two")

            # A rolling update: the new pod starts before the old one stops, and takes over.
            with replica(kube, tmp_path, "lakeslot-new-c") as c:
                wait_for(lambda: a.text().count(PAUSED) >= 2, "the old replica to pause for the new")
                create(api, "three")
                wait_for(lambda: status_written(api, "three"), "ingestion three reconciled mid-rollout")
                assert c.reconciled("three") and not a.reconciled("three")
                a.process.send_signal(signal.SIGTERM)  # the old pod goes
                assert a.process.wait(60) == 0, a.text()
                create(api, "four")
                wait_for(lambda: status_written(api, "four"), "ingestion four reconciled after the rollout")
                assert c.reconciled("four")
                wait_for(lambda: a.pod not in peers(api), "the stopped replica to leave the peering")
                replicas = (a, b, c)
        for r in replicas:
            assert EQUAL_PRIORITIES not in r.text(), r.pod


@pytest.mark.parametrize("started", [(1, 2), (2, 1)])
def test_priorities_are_distinct_and_newest_first(started):
    first, second = (peering.priority("lakeslot-x", started_ns=n * 1_000_000_000) for n in started)
    assert (first < second) == (started[0] < started[1])
    same_moment = {peering.priority(f"lakeslot-{i}", started_ns=10**18) for i in range(50)}
    assert len(same_moment) > 45  # pods started in the same millisecond still differ (but rarely)
