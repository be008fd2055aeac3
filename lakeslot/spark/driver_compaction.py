"""A small mirror compacted on the driver: the live rows of one snapshot read into one Parquet
file that replaces every data and delete file of it, in one Iceberg ``RewriteFiles`` — no Spark
job (:func:`compact`).

Why: Spark's ``rewriteDataFiles`` costs ≥ 0.2 s even for a 1,000-row table (a job and its
planning). With hundreds of busy tables, each due after a few passes, maintenance's share of a
pass covered a fraction of them: the others kept gathering delete files and manifests, and every
commit and lookup on them grew slower.

Invariants:

- **Same rows, same position.** The rows are those a reader of the snapshot sees: each live data
  file's rows by field ID, less the positions its delete files delete — the delete files paired
  with it as Iceberg pairs them (:class:`lakeslot.spark.row_delta.Deletes`) —, cast to the
  current schema's types (a file written before a column was added reads NULL for it, one
  written before a type was widened is cast; a rename keeps the field ID). The commit is a
  ``replace`` validated from that snapshot, carrying the caller's summary properties (the
  position it keeps): a commit since that removed one of its files or added deletes to one fails
  Iceberg's validation, and nothing is committed (:class:`lakeslot.spark.row_delta.Conflict`).
- **Only what it covers**, decided before anything is written
  (:class:`lakeslot.spark.row_delta.Unsupported`: the caller uses Spark's action): an
  unpartitioned table of Parquet data files and position deletes, every column of a type the
  driver writes (:func:`lakeslot.spark.row_delta.writes`), and files of at most
  :data:`LIMIT_BYTES` in all and at most its target file size (one file is the right result;
  the driver holds the rows: DESIGN.md "Scale").
- The Java side is one call (``Compactions.rewrite``, ``java/Compactions.java``): it lists the
  snapshot's files from its manifests and checks they are the data files read. The live files
  of the snapshot it makes are then known to :class:`lakeslot.spark.row_delta.Positions` (the
  next row delta on the table reads no manifest).
- On object storage a compaction's reads are not one after the other: the data files and their
  delete files are read at once (the caller's ``each``), and so are the manifests, by the Java
  side and by its commit — a small table compacted after a few passes has tens of files and
  manifests (38 manifest reads in the object-storage test), ≈ 2–3 s in a row at 30 ms a request.

Failure modes: :class:`~lakeslot.spark.row_delta.Unsupported` and
:class:`~lakeslot.spark.row_delta.Conflict` as above; storage and catalog errors propagate and
leave the table as it was (a file written for a commit that then failed is an orphan, which
orphan-file removal deletes).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io.pyarrow import schema_to_pyarrow

from lakeslot.spark import row_delta
from lakeslot.spark.helpers import COMPACTIONS, ROW_DELTAS, loaded
from lakeslot.spark.jvm import java
from lakeslot.spark.tables import schema_of

LIMIT_BYTES = 32 << 20  # a table's files compacted on the driver, at most (compressed Parquet)

# work for each of the items, in their order: {item: its result}
Each = Callable[[Sequence[int], Callable[[int], pa.Table]], dict[int, pa.Table]]


@dataclass(frozen=True)
class Compacted:
    """What a compaction replaced (data and delete files), and the live files it left
    (:data:`lakeslot.spark.row_delta.ENTRIES`: none, or the one it wrote)."""

    data_files: int
    delete_files: int
    files: pa.Table


def available(jvm) -> bool:
    """Whether the JVM has lakeslot's ``Compactions`` and ``RowDeltas``
    (:mod:`lakeslot.spark.helpers`): without them, Spark's action compacts."""
    return loaded(jvm, COMPACTIONS) is not None and loaded(jvm, ROW_DELTAS) is not None


def compact(jvm, table, positions: row_delta.Positions, properties: Mapping[str, str],
            session_codec: str | None, size: int, target_file_bytes: int, each: Each
            ) -> Compacted:
    """Compact the Java Iceberg ``table`` (refreshed), whose files hold ``size`` bytes, into one
    data file, committed with ``properties`` in its summary (see the module docstring);
    ``session_codec``: the session's Iceberg codec, if it sets one; ``each``: how the data files
    are read (several at once where they are not on local disk:
    :func:`lakeslot.spark.session.on_threads`)."""
    if size > min(LIMIT_BYTES, target_file_bytes):
        raise row_delta.Unsupported(f"its {size} bytes of files are more than the driver "
                                    "compacts")
    described = row_delta.describe(jvm, table, [row_delta.CODEC_PROPERTY])
    if described.snapshot is None:
        raise row_delta.Unsupported("the table has no snapshot")
    schema = schema_of(jvm, table)
    if not row_delta.writes_every_column(schema):
        raise row_delta.Unsupported("the table has columns of types the driver does not write")
    codec = row_delta.compression(session_codec, described)
    files = positions.files(jvm, table, described)
    deletes = row_delta.Deletes(files)
    arrow = schema_to_pyarrow(schema)
    ids = [f.field_id for f in schema.fields]
    data = row_delta.data_files(files)

    def live(n: int) -> pa.Table:
        path = data[n]["file_path"]
        read = positions.columns(jvm, table, path, ids, data[n]["size"])  # (no size asked)
        gone = positions.deleted(jvm, table, path, deletes.of(path, data[n]["sequence"]))
        if len(gone):
            read = read.filter(pc.invert(pc.is_in(pa.array(np.arange(read.num_rows)),
                                                  value_set=gone)))
        return pa.Table.from_arrays(
            [read[str(i)].cast(field.type) for i, field in zip(ids, arrow, strict=True)],
            schema=arrow)

    parts = list(each(range(len(data)), live).values())
    rows = pa.concat_tables(parts) if parts else arrow.empty_table()
    request: dict = {"from": described.snapshot, "data": [e["file_path"] for e in data],
                     "file": None, "properties": dict(properties)}
    footer = b""
    written = None
    if len(rows):
        [written] = row_delta.locations(jvm, table, [f"compacted-{uuid.uuid4().hex}.parquet"])
        content = row_delta.write(table.io, written, rows, codec)
        footer = row_delta.footer(content)
        request["file"] = {"path": written, "size": len(content)}
    answer = row_delta.validated(java(jvm, f"{COMPACTIONS}.rewrite"), table,
                                 json.dumps(request), bytearray(footer))
    left = row_delta.added_files([] if written is None else [written], answer["sequence"])
    positions.known(answer["manifest_list"], left)
    return Compacted(answer["data"], answer["deletes"], left)
