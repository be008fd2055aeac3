"""The source control plane: everything lakeslot does to a PostgreSQL database besides reading
data. Plain Python (no kopf), used by the operator, the reader and local mode.

- ``connection``: connections built from resolved settings, identified by ``application_name``.
- ``tables``: table names and their resolution against the catalog.
- ``preflight``: checks that say what is wrong and the SQL or setting that fixes it.
- ``publication``: make the publication match the spec (or only verify one we do not own).
- ``slot``: the permanent slot — ensure, health, lost detection, stale-holder eviction, drop.
- ``columns``: a table described for its mirror (columns mapped by type, key), one way for the
  snapshot, the apply job and ``verify``.

Every SQL identifier is quoted with ``psycopg.sql``; every value is bound.
"""
