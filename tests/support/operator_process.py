"""The real operator in a process of its own whose environment holds no credentials, as a pod's
would: what it reads for an ingestion (staging, the warehouse, the catalog) it must reach with
what that ingestion's Secrets give it, never with the test's variables.

- :func:`scrubbed_operator` starts ``python -m tests.support.operator_process`` with an
  environment of :data:`KEPT` only (no ``AWS_*``, no catalog or database credential, no
  ``KUBECONFIG``), pointed at the Kubernetes API emulator, and yields its metrics URL once it
  answers. On leaving it stops the process (SIGTERM) and prints the tail of its log (shown by
  pytest when the test fails).
- The process itself (:func:`main`) refuses to start when a credential-looking variable reached it
  (so the scrubbing cannot silently regress), then runs lakeslot's own handlers
  (:func:`lakeslot_operator.handlers.build_registry`) with a 1-s timer — the only departure from
  ``lakeslot operator``, whose 30-s timer would make the tests slow — and serves the operator's
  metrics.

Failure modes: a process that exits while starting, or whose metrics do not answer within
``wait_for``'s timeout, fails the test with its log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
# All a pod's process needs from its environment here; nothing that reaches storage or a catalog.
KEPT = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "JAVA_HOME")
CREDENTIAL_LIKE = re.compile(r"^AWS_|^AZURE_|^GOOGLE_|PASSWORD|SECRET|TOKEN|CREDENTIAL|^PG|^LAKESLOT_CATALOG_"
                             r"|^KUBECONFIG$")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError):
        return False


@contextlib.contextmanager
def scrubbed_operator(server: str, log: Path) -> Iterator[str]:
    """Run the operator against the API server at ``server`` in a scrubbed process; yields its
    metrics URL."""
    port = free_port()
    environment = {k: os.environ[k] for k in KEPT if k in os.environ}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "operator")])
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.operator_process", "--server", server,
             "--metrics-port", str(port)],
            cwd=ROOT, env=environment, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for(lambda: process.poll() is not None or _answers(url), "the scrubbed operator's metrics")
        assert process.poll() is None, log.read_text()
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        print(log.read_text()[-20000:])


def main(argv: list[str] | None = None) -> None:
    import kopf
    import kubernetes.client

    from lakeslot_operator.handlers import build_registry
    from lakeslot_operator.kube import Kube
    from lakeslot_operator.metrics import OperatorMetrics
    from lakeslot_operator.reconcile import Context
    from tests.support.fixtures_kube import quick_settings

    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    args = parser.parse_args(argv)
    leaked = sorted(k for k in os.environ if CREDENTIAL_LIKE.search(k))
    if leaked:
        sys.exit(f"operator_process: credential-like variables reached the operator: {leaked}")
    configuration = kubernetes.client.Configuration()
    configuration.host = args.server
    metrics = OperatorMetrics()
    metrics.serve(args.metrics_port, "127.0.0.1")
    registry = build_registry(Context(kube=Kube(kubernetes.client.ApiClient(configuration))),
                              timer_interval=1.0, login_via_client=False, metrics=metrics)

    @kopf.on.login(registry=registry)
    def login(**_: object) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=args.server, insecure=True, default_namespace="default")

    kopf.configure()
    asyncio.run(kopf.operator(registry=registry, settings=quick_settings(), clusterwide=True,
                              standalone=True))


if __name__ == "__main__":
    main()
