"""Fixtures: the Kubernetes API emulator, and running the real kopf operator against it.

* ``kube_emulator_session`` — one ``KubeEmulator`` (tests/support/kube_emulator.py) per session.
* ``kube`` — that emulator, emptied by ``reset()`` before the test; the test fails at teardown if
  the emulator failed internally (answered HTTP 500) while it ran.
* ``running_operator(kube, registry, ...)`` — a context manager running ``kopf.operator()`` in a
  background thread with its own event loop until the block exits; ``kopf_peering_crds()`` are
  the CRDs to create first when running with peering.

Why a thread and not ``kopf.testing.KopfRunner``: KopfRunner goes through click's CLI runner,
which swaps ``sys.stdout`` for the whole process while the operator runs (breaking pytest's
capture and other threads' output), and it takes the registry only through module imports.
``kopf.operator()`` takes an explicit registry, settings and flags.

Failure modes: if the operator does not report readiness within ``startup_timeout``, or does not
stop within ``stop_timeout`` after the block, or dies with an exception, the helper raises
(``OperatorError``) with the cause instead of hanging or passing silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import Collection, Coroutine, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from tests.support.kube_emulator import KubeEmulator

PEERING_CRDS = Path(__file__).resolve().parents[2] / "helm" / "lakeslot" / "crds" / "kopf-peering.yaml"


@pytest.fixture(scope='session')
def kube_emulator_session() -> Iterator[KubeEmulator]:
    with KubeEmulator() as emulator:
        yield emulator


@pytest.fixture
def kube(kube_emulator_session: KubeEmulator) -> Iterator[KubeEmulator]:
    kube_emulator_session.reset()
    kube_emulator_session.pop_internal_errors()
    yield kube_emulator_session
    errors = kube_emulator_session.pop_internal_errors()
    if errors:
        pytest.fail(f'the Kubernetes emulator failed internally (HTTP 500) during the test: {errors!r}')


def kopf_peering_crds() -> list[dict[str, Any]]:
    """kopf's peering CRDs, as the Helm chart installs them (tests that run with peering)."""
    return list(yaml.safe_load_all(PEERING_CRDS.read_text()))


class OperatorError(RuntimeError):
    """The operator thread failed to start, stop, or crashed."""


@dataclasses.dataclass
class OperatorRun:
    """A running operator: ``memo`` is the operator's memo; ``error`` is set if it crashed."""
    memo: kopf.Memo
    stop_flag: threading.Event = dataclasses.field(default_factory=threading.Event)
    ready_flag: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: BaseException | None = None


def quick_settings() -> kopf.OperatorSettings:
    """Operator settings suited to tests: idle workers and hung requests do not linger."""
    settings = kopf.OperatorSettings()
    settings.queueing.idle_timeout = 1.0  # per-object workers exit sooner when idle
    settings.networking.request_timeout = 10.0  # fail fast rather than hang a test
    return settings


@contextlib.contextmanager
def running_operator(
        kube: KubeEmulator,
        registry: kopf.OperatorRegistry,
        *,
        namespaces: Collection[str] = (),
        peering_name: str | None = None,
        settings: kopf.OperatorSettings | None = None,
        memo: kopf.Memo | None = None,
        startup_timeout: float = 30.0,
        stop_timeout: float = 30.0,
) -> Iterator[OperatorRun]:
    """Run kopf with ``registry``'s handlers against ``kube`` until the block exits.

    Cluster-wide (``--all-namespaces``) unless ``namespaces`` are given; standalone (no peering)
    unless ``peering_name`` names a peering object (whose CRD the test must have created). A login
    handler pointing at the emulator is added to ``registry`` (a fresh registry has none).
    """
    @kopf.on.login(registry=registry)
    def login_to_emulator(**_: object) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=kube.url, insecure=True, default_namespace='default')

    run = OperatorRun(memo=memo if memo is not None else kopf.Memo())
    operator = kopf.operator(
        registry=registry,
        settings=settings if settings is not None else quick_settings(),
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        standalone=peering_name is None,
        peering_name=peering_name,
        memo=run.memo,
        stop_flag=run.stop_flag,
        ready_flag=run.ready_flag,
    )
    thread = threading.Thread(target=_run_operator, args=(run, operator), name='kopf-operator', daemon=True)
    thread.start()
    try:
        _wait_until_ready(run, thread, startup_timeout)
        yield run
    finally:
        run.stop_flag.set()
        thread.join(stop_timeout)
    if thread.is_alive():
        raise OperatorError(f'the operator did not stop within {stop_timeout}s')
    if run.error is not None:
        raise OperatorError('the operator crashed') from run.error


def _wait_until_ready(run: OperatorRun, thread: threading.Thread, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not run.ready_flag.wait(0.1):
        if not thread.is_alive():
            raise OperatorError('the operator exited while starting') from run.error
        if time.monotonic() > deadline:
            raise OperatorError(f'the operator did not start within {timeout}s')


def _run_operator(run: OperatorRun, operator: Coroutine[None, None, None]) -> None:
    try:
        asyncio.run(operator)
    except BaseException as e:  # noqa: BLE001 - reported by running_operator() in the test's thread
        run.error = e
