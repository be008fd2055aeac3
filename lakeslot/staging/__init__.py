"""Staging: the contract between the replication reader and everything that consumes its output.

- :mod:`.segments` — sealed segments: names (``<start>-<end>.parquet``), the row schema, the footer
  metadata, tuple markers (NULL / unchanged TOAST / not in a key-only old tuple), chains of
  segments and :class:`~.format.GapError`.
- :mod:`.relations` — relation descriptions (table, replica identity, columns and types) as
  recorded in each segment.
- :mod:`.store` — :class:`~.store.Staging`: a filesystem from the URI, list/read/delete, the atomic
  seal the writer uses, per-table change counts, and the documents kept next to the segments.
- :mod:`.apply_status` — the apply job's status document (``apply-status.json``): what the last
  pass did per table, for local mode, metrics and the operator.

The reader (:mod:`lakeslot.reader.writer`) is the only producer; the apply job, the status and
local mode import from here, never from the reader.
"""
