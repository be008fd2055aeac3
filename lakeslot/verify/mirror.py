"""The mirror side of a check: Iceberg mirror tables read with pyiceberg (no Spark, none of the
apply job's code), each column cast to the Arrow type its source column maps to.

Invariants:

- The exact check reads the mirror at the first Iceberg snapshot, in commit order among the
  current snapshot's ancestors, whose ``lakeslot.lsn`` is at or above the source snapshot's
  ``P`` (time travel; its position is ``L``): by DESIGN.md invariant 1 the mirror there equals
  the source as of ``L``. An idle table's current snapshot counts too when the apply job's
  status document says it is covered to ``L ≥ P`` above it (:mod:`lakeslot.apply.coverage`):
  nothing of the table is staged in between, so it equals the source as of ``L`` as well.
  :func:`wait_for_mirror` waits for such a snapshot (up to a deadline), reading the table
  afresh each :data:`POLL_S`.
- The schema read is the one of that snapshot: a source column the mirror lacks there is
  reported, never read as NULL.
- Reading only some keys prunes the scan by key where pyiceberg can (a single integer or text
  key column); otherwise every row is read and the comparison selects the keys.
- The quiet-source check reads the mirror's current snapshot (:func:`current_rows`).

Failure modes: a missing mirror table, or one without a snapshot, is "no rows" for
:func:`current_rows` and "behind" for :func:`wait_for_mirror`, which also stops waiting when the
apply job stopped the table (its properties say why: :func:`lakeslot.mirror.contract.apply_error`)
and at the deadline says how far behind the mirror is (a running pipeline must reach ``P``). A
metadata file replaced while it is read is read again; other catalog and storage errors propagate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import In
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot as IcebergSnapshot
from pyiceberg.table.snapshots import ancestors_of

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.mirror import catalogs, typemap
from lakeslot.mirror.contract import LSN_PROPERTY, apply_error
from lakeslot.mirror.progress import covered_to
from lakeslot.staging import apply_status
from lakeslot.staging.store import Staging
from lakeslot.verify.inflight import ChangedKey
from lakeslot.verify.report import lsn_or_dash
from lakeslot.workloads import JobInput

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often the mirror's position is read while waiting


def current_rows(job: JobInput, table: TableName, columns: tuple[typemap.ColumnMapping, ...],
                 secrets: Mapping[str, str] | None) -> pa.Table | None:
    """The mirror's rows now (None: no mirror table, or no snapshot yet)."""
    loaded = catalogs.load_table(job.ingestion.spec.sink.catalog,
                                 job.names.mirror_identifier(table), secrets)
    if loaded is None or loaded.current_snapshot() is None:
        return None
    data = loaded.scan(selected_fields=tuple(c.name for c in columns)).to_arrow()
    return pa.table({c.name: data[c.name].cast(c.arrow) for c in columns})


def _position(snapshot: IcebergSnapshot) -> int | None:
    value = snapshot.summary.get(LSN_PROPERTY) if snapshot.summary is not None else None
    return int(value) if value is not None else None


def first_snapshot_at(table: IcebergTable, position: int) -> IcebergSnapshot | None:
    """The first snapshot (in commit order, among the current snapshot's ancestors) whose
    ``lakeslot.lsn`` is at or above ``position``."""
    ancestry = list(ancestors_of(table.current_snapshot(), table.metadata))
    return next((s for s in reversed(ancestry) if _at_or_above(_position(s), position)), None)


def _at_or_above(lsn: int | None, position: int) -> bool:
    return lsn is not None and lsn >= position


def _covered(job: JobInput, table: TableName, committed: int | None) -> int | None:
    """How far the apply job's status document says the table is covered while the mirror is at
    ``committed`` (:mod:`lakeslot.apply.coverage`), or None."""
    if committed is None:
        return None
    document = Staging(job.ingestion.spec.staging.uri, create=False).read_apply_status()
    return covered_to(apply_status.covered(document), table, committed)


@dataclass(frozen=True)
class Reached:
    table: IcebergTable
    snapshot: IcebergSnapshot
    lsn: int


def wait_for_mirror(job: JobInput, table: TableName, position: int, deadline: float,
                    secrets: Mapping[str, str] | None, timeout: float,
                    say: Callable[[str], None]) -> Reached | str:
    """The first mirror snapshot at or above ``position``, once there is one; or, at the
    deadline or when the apply job stopped the table, why not."""
    said = False
    current: int | None = None
    while True:
        try:
            loaded = catalogs.load_table(job.ingestion.spec.sink.catalog,
                                         job.names.mirror_identifier(table), secrets)
        except OSError as e:  # a metadata file replaced while read: try again
            log.debug("reading the mirror of %s: %s", table, e)
            loaded = None
        if loaded is not None:
            snapshot = first_snapshot_at(loaded, position)
            if snapshot is not None:
                lsn = _position(snapshot)
                assert lsn is not None  # first_snapshot_at chose it by its position
                return Reached(loaded, snapshot, lsn)
            head = loaded.current_snapshot()
            current = _position(head) if head is not None else None
            covered = _covered(job, table, current)
            if head is not None and covered is not None and covered >= position:
                return Reached(loaded, head, covered)
            stopped = apply_error(loaded.properties, current)
            if stopped:
                return f"the apply job stopped this table at {lsn_or_dash(current)}: {stopped}"
        if time.monotonic() >= deadline:
            if current is None:
                return (f"the mirror table has no lakeslot snapshot yet after waiting {timeout:.0f} s "
                        "(is the snapshot running: lakeslot run, or the operator?)")
            return (f"the mirror is behind: at {lsn_text.format(current)}, "
                    f"{lsn_text.human_bytes(position - current)} behind the source snapshot at "
                    f"{lsn_text.format(position)} after waiting {timeout:.0f} s; verify needs a "
                    "running pipeline (lakeslot run, or the operator's apply job) that reaches it")
        if not said:
            say(f"  waiting for the mirror of {table} to reach {lsn_text.format(position)} "
                f"(at {lsn_or_dash(current)})")
            said = True
        time.sleep(POLL_S)


def mirror_rows(reached: Reached, columns: tuple[typemap.ColumnMapping, ...],
                keys: dict[str, ChangedKey] | None) -> pa.Table | list[str]:
    """The mirror's rows at the chosen snapshot (pruned to ``keys`` where pyiceberg can: one
    integer or text key column), or the source columns it lacks."""
    snapshot = reached.snapshot
    schema = reached.table.schemas().get(snapshot.schema_id) if snapshot.schema_id is not None \
        else None
    schema = schema or reached.table.schema()
    present = {f.name for f in schema.fields}
    lacking = [c.name for c in columns if c.name not in present]
    if lacking:
        return lacking
    scan: dict[str, Any] = {"snapshot_id": snapshot.snapshot_id,
                            "selected_fields": tuple(c.name for c in columns)}
    key_columns = [c for c in columns if c.required]
    if keys is not None and len(key_columns) == 1 and (
            pa.types.is_integer(key_columns[0].arrow) or pa.types.is_string(key_columns[0].arrow)):
        values = [k.values[0] for k in keys.values()]
        if not values:
            return pa.table({c.name: pa.array([], c.arrow) for c in columns})
        scan["row_filter"] = In(term=key_columns[0].name, literals=values)
    data = reached.table.scan(**scan).to_arrow()
    return pa.table({c.name: data[c.name].cast(c.arrow) for c in columns})
