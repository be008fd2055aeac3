"""A primary and a physical standby on one machine, reached the way an HA client reaches them.

- :func:`ha_pair` starts a primary of one PostgreSQL version (``wal_sender_timeout`` 5 s, so a
  walsender gives up on a dead peer quickly) on 127.0.0.1 and its standby
  (:meth:`lakeslot.local.pgcluster.Cluster.standby`) on 127.0.0.2 with the same port, so that one libpq
  host list with one port reaches both; both are destroyed afterwards. A version that is not
  installed or cannot start skips the test with the reason.
- :class:`SteadyWorkload`: the chaos suite's workload without its large transactions, so that
  a failover test spends its time on the failover rather than on applying bulk updates.
- :class:`HaDatabase` is a database of that pair: ``connect()`` goes through the host list with
  ``target_session_attrs=read-write``, so after a promotion it reaches the new primary, like the
  application and lakeslot do; ``cluster`` is the primary it was created on (port, superuser and
  password are the standby's too: it is a byte copy).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
import pytest

from lakeslot.local import pgcluster
from tests.chaos.harness import ChaosWorkload
from tests.support.fixtures_pg import RESTARTABLE_SETTINGS, VERSIONS


@contextmanager
def ha_pair(version: str) -> Iterator[tuple[pgcluster.Cluster, pgcluster.Cluster]]:
    install = VERSIONS[version]()
    if install is None:
        pytest.skip(f"PostgreSQL {version} is not installed")
    try:
        primary = pgcluster.Cluster(install, settings=dict(RESTARTABLE_SETTINGS)).start()
    except pgcluster.ClusterError as e:
        pytest.skip(f"PostgreSQL {version} unavailable: {e}")
    try:
        standby = primary.standby()
        try:
            yield primary, standby
        finally:
            standby.destroy()
    finally:
        primary.destroy()


@dataclass
class HaDatabase:
    cluster: pgcluster.Cluster
    standby: pgcluster.Cluster
    name: str

    @property
    def hosts(self) -> str:
        return f"{self.cluster.address},{self.standby.address}"

    def connect(self, **kwargs) -> psycopg.Connection:
        kwargs.setdefault("autocommit", True)
        dsn = psycopg.conninfo.make_conninfo(
            self.cluster.dsn(self.name), host=self.hosts, target_session_attrs="read-write")
        return psycopg.connect(dsn, **kwargs)


def failover_ready(standby: pgcluster.Cluster, slot: str) -> bool:
    """The standby has synchronized ``slot`` for good (PostgreSQL 17+): a promotion keeps it.
    (A synced slot stays temporary until the primary's copy moved past the standby's start; a
    temporary one is dropped at promotion.)"""
    with standby.connect() as conn:
        row = conn.execute("SELECT synced AND NOT temporary AND NOT conflicting"
                           " FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return bool(row and row[0])


class SteadyWorkload(ChaosWorkload):
    def large(self) -> None:
        self.transaction(self.rng.randint(1, 4))
