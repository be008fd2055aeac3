"""Is the mirror equal to the source? Two checks, both over every replicated column of every row.

The expected content of a mirror table is the source table's rows, every replicated column,
each value converted by the one type mapping (:mod:`lakeslot.mirror.typemap`) from its PostgreSQL text
form — exactly the path a streamed change takes. The source is read in a session with lakeslot's
settings (UTC, ISO dates, full float precision); the mirror is read with pyiceberg (no Spark,
none of the apply job's code) and cast to the same Arrow types.

- :mod:`.exact` — **the exact check** (``lakeslot verify``, and the operator's verification
  Job): equality at one LSN while the source is being written and the pipeline runs, in rounds.
- :mod:`.checksums` — **the quiet-source check** (the demo and tests, after a run caught up and
  stopped): row counts and full-content checksums.

What they are built from:

- :mod:`.source` — the source side: rows as the mirror should hold them, all or by key; the
  table's catalog fingerprint.
- :mod:`.mirror` — the mirror side: the first Iceberg snapshot at or above an LSN (waiting for
  it), its rows; the current rows.
- :mod:`.inflight` — staging: local copies of the segments that appear while a check runs, and
  the keys their changes touched in an LSN range.
- :mod:`.diff` — the row comparison by key (missing, extra, differing; keys held by several rows).
- :mod:`.report` — the result of the exact check: per table the counts and the first keys, and
  its text and JSON forms (the document the operator reads).
- :mod:`.request` — what a check is asked to do: table names as PostgreSQL reads them, and
  the request token of a verification the operator runs.

Scope: the exact check reads any ``sink.catalog`` pyiceberg can read
(:func:`lakeslot.mirror.catalogs.load_table`), and so does the quiet-source check.
Nothing here imports local mode (:mod:`lakeslot.local`) or the operator: the command line glue
(:mod:`lakeslot.local.verify`) and the operator call in.
"""
