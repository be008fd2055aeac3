"""The leader: one exported snapshot and its LSN, held open while the followers copy.

:func:`exported_snapshot` (a context manager) opens a replication connection and runs, as the
first statements of one transaction (FACTS.md: USE_SNAPSHOT works only there)::

    BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ;
    CREATE_REPLICATION_SLOT "lakeslot_snap_<random>" TEMPORARY LOGICAL pgoutput USE_SNAPSHOT;
    SELECT pg_export_snapshot();

The transaction's snapshot is the slot's consistent point, so the snapshot LSN is
``s = consistent_point − 1``: every transaction committed at or below ``s`` is visible, none above.
The permanent slot of the ingestion was created earlier (DESIGN rule 2), so its stream holds every
change after ``s``.

Invariants:

- The exported snapshot is importable only while this transaction is open: the ``with`` block is
  the followers' whole lifetime, and the leader commits only after them ("leader commits last").
- The temporary slot never outlives the job: it is dropped explicitly on the way out, and
  PostgreSQL drops a temporary slot when its session ends, which covers a killed driver. Server-side
  TCP keepalives make PostgreSQL notice a vanished driver host within about two minutes.
- :func:`import_statements` is the only way sessions join the snapshot: ``BEGIN … REPEATABLE READ
  READ ONLY`` then ``SET TRANSACTION SNAPSHOT``, with nothing run before them in that transaction.

Failure modes: creating the slot waits for transactions running at that moment to finish (the
session has no statement timeout); ``max_replication_slots`` / ``max_wal_senders`` exhausted,
missing REPLICATION privilege or ``wal_level`` below logical raise :class:`psycopg.Error` with the
server's message; holding the snapshot keeps VACUUM from removing rows deleted after it (the cost
of a long snapshot, as with ``pg_dump``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg

from lakeslot import lsn_text
from lakeslot.source.connection import ConnectionSettings, connect, one_row

log = logging.getLogger(__name__)

SLOT_PREFIX = "lakeslot_snap_"
# Notice a vanished driver host (a killed process closes its socket, which the server sees at once).
KEEPALIVES = {"tcp_keepalives_idle": "30", "tcp_keepalives_interval": "10",
              "tcp_keepalives_count": "6"}
_SNAPSHOT_ID = re.compile(r"[0-9A-F]+-[0-9A-F]+(-[0-9]+)?")


@dataclass(frozen=True)
class Snapshot:
    name: str  # the exported snapshot's identifier, for SET TRANSACTION SNAPSHOT
    lsn: int  # s: the snapshot shows exactly the transactions committed at or below it
    slot: str  # the temporary slot holding it
    server_version: int


def import_statements(snapshot_name: str) -> list[str]:
    """The statements that make a fresh transaction see the exported snapshot."""
    if not _SNAPSHOT_ID.fullmatch(snapshot_name):
        raise ValueError(f"not an exported snapshot identifier: {snapshot_name!r}")
    return ["BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            f"SET TRANSACTION SNAPSHOT '{snapshot_name}'"]


@contextlib.contextmanager
def exported_snapshot(settings: ConnectionSettings, app_name: str) -> Iterator[Snapshot]:
    conn = connect(settings, app_name, long_running=True, replication=True)
    slot = SLOT_PREFIX + uuid.uuid4().hex[:16]
    try:
        for name, value in KEEPALIVES.items():
            conn.execute(f"SET {name} = {value}")
        conn.execute("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ")
        consistent_point = one_row(conn.execute(
            f'CREATE_REPLICATION_SLOT "{slot}" TEMPORARY LOGICAL pgoutput USE_SNAPSHOT'))[1]
        name = one_row(conn.execute("SELECT pg_export_snapshot()"))[0]
        snapshot = Snapshot(name, lsn_text.parse(consistent_point) - 1, slot, conn.info.server_version)
        log.info("exported snapshot %s at LSN %s (temporary slot %s)", name,
                 lsn_text.format(snapshot.lsn), slot)
        yield snapshot
    finally:
        _release(conn, slot)


def _release(conn: psycopg.Connection, slot: str) -> None:
    """End the transaction (read-only: nothing to lose) and drop the slot. Errors are ignored:
    closing the session ends both anyway, and a leader connection lost at the very end does not
    invalidate tables already committed (their followers read under the snapshot)."""
    with contextlib.suppress(psycopg.Error):
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("COMMIT")
        conn.execute(f'DROP_REPLICATION_SLOT "{slot}"')
    conn.close()
