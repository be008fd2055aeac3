"""The source control plane: everything lakeslot does to a PostgreSQL database besides reading
the change stream. Plain Python (no kopf), used by the operator, the jobs, the reader and local
mode.

- :mod:`.connection` — connections built from resolved settings, identified by
  ``application_name``.
- :mod:`.tables` — table names and their resolution against the catalog.
- :mod:`.preflight` — checks that say what is wrong and the SQL or setting that fixes it.
- :mod:`.publication` — make the publication match the spec (or only verify one we do not own).
- :mod:`.slot` — the permanent slot: ensure, health, lost detection, stale-holder eviction, drop;
  :mod:`.failover` — whether the slot survives a promotion, and whether one lost it.
- :mod:`.columns` — a table described for its mirror (columns mapped by type, key), one way for
  the snapshot, the apply job and ``verify``; :mod:`.keys` — which columns are a table's key, and
  configured key columns checked on the data.
- :mod:`.exported_snapshot` — the snapshot's leader: one exported snapshot and its LSN, held open
  while the followers copy (``verify`` reads its source side the same way).
- :mod:`.facts` — catalog facts no row change reports (OIDs, ``attnum``, heaps), recorded with
  each snapshot and compared on every apply pass; :mod:`.ddl_capture` — lakeslot's event trigger
  and the DDL messages it writes into the WAL.
- :mod:`.cleanup` — what deleting an ingestion does to the source, per ``deletionPolicy``.

Every SQL identifier is quoted with ``psycopg.sql``; every value is bound.
"""
