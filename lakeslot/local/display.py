"""Progress of a local run for humans: redrawn in place on a terminal, log lines otherwise.

What it shows comes from the status model (:mod:`.observe`) plus the snapshot's progress
document: per table the state, the snapshot's rows copied / estimated, rows in the mirror (its
live row count: data records minus the rows deleted by position, from the Iceberg snapshot
summary, :func:`lakeslot.mirror.progress.live_rows`; ``-`` when unknown), the applied LSN, the
changes staged but not applied and the seconds behind the source (freshness); overall the
reader's durable LSN, the applied LSN, the lag in bytes and seconds behind the source, and how
long ago the last Iceberg commit was.

Invariant: it only reads; a status it cannot render is shown as far as it goes, never raised.
On a terminal a frame is rewritten in place (ANSI cursor movement); otherwise one line is logged
when the phase or a condition changes and at most every :data:`LOG_EVERY_S` seconds besides, and
on a change each failing condition with its reason and message (e.g. the reader retrying a
full staging: ``Streaming: StagingUnwritable: …``).
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import UTC, datetime
from typing import TextIO

from lakeslot import lsn_text
from lakeslot.api.models import PostgresIngestionStatus
from lakeslot.api.naming import TableName
from lakeslot.local import observe
from lakeslot.local.config import Local

log = logging.getLogger("lakeslot.local")
LOG_EVERY_S = 15.0


def _ago(when: datetime | None) -> str:
    if when is None:
        return "-"
    return f"{(datetime.now(UTC) - when).total_seconds():.1f} s ago"


def _seconds(value: int | None) -> str:
    return "-" if value is None else f"{value:,} s"


def frame(local: Local, status: PostgresIngestionStatus, elapsed: float,
          target: int | None, apply_seconds: float | None = None) -> list[str]:
    """The lines of one screen."""
    ing = local.ingestion
    ready = next((c for c in status.conditions if c.type == "Ready"), None)
    reader, apply = status.reader, status.apply
    lines = [
        f"lakeslot run {ing.metadata.namespace or 'default'}/{ing.metadata.name}   "
        f"phase {status.phase or '-'}   ready {ready.status if ready else '-'}"
        f"{f' ({ready.reason})' if ready and ready.status != 'True' else ''}   "
        f"{elapsed:,.0f} s" + (f"   --once up to {lsn_text.format(target)}" if target is not None else ""),
        f"durable {reader.durable_lsn if reader and reader.durable_lsn else '-'} "
        f"(reader lag {lsn_text.human_bytes(reader.lag_bytes if reader else None)})   "
        f"applied {apply.applied_lsn if apply and apply.applied_lsn else '-'} "
        f"(lag {lsn_text.human_bytes(status.lag_bytes)}, {_seconds(apply.lag_seconds if apply else None)} behind)   "
        f"last commit {_ago(apply.last_commit_time if apply else None)}"
        + (f" (apply pass {apply_seconds:.1f} s)" if apply_seconds is not None else ""),
    ]
    snapshot = {TableName(t["schema"], t["name"]): t
                for t in (observe.snapshot_document(local) or {}).get("tables", [])}
    rows = [("table", "state", "snapshot rows", "mirror rows", "applied LSN", "staged", "behind")]
    for t in status.tables:
        name = TableName(t.schema_name, t.name)
        copied = snapshot.get(name)
        copy_text = "-" if copied is None or copied["state"] == "skipped" else (
            f"{copied['rowsStaged']:,}/{copied['rowsEstimated']:,}" if copied.get("rowsEstimated")
            is not None else f"{copied['rowsStaged']:,}")
        rows.append((str(name)[:40], t.state, copy_text,
                     "-" if t.rows_known is None else f"{t.rows_known:,}", t.applied_lsn or "-",
                     "-" if t.rows_staged is None else f"{t.rows_staged:,}", _seconds(t.lag_seconds)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    lines += condition_lines(status)
    lines += [f"{t.schema_name}.{t.name}: {t.message.splitlines()[0]}"[:160]
              for t in status.tables if t.message]
    return lines


def condition_lines(status: PostgresIngestionStatus) -> list[str]:
    """One line per failing condition but Ready (which repeats the first): type, reason and
    the message's first line."""
    problems = [c for c in status.conditions
                if (c.status == "False" and c.type != "Degraded") or
                (c.type == "Degraded" and c.status == "True")]
    return [f"{c.type}: {c.reason}: {c.message.splitlines()[0] if c.message else ''}"[:160]
            for c in problems if c.type != "Ready"]


def summary_line(status: PostgresIngestionStatus, apply_seconds: float | None = None) -> str:
    reader, apply = status.reader, status.apply
    tables = ", ".join(f"{t.name}={t.state}"
                       + (f"({t.rows_known} rows, {t.rows_staged} staged)"
                          if t.rows_known is not None else "") for t in status.tables)
    return (f"phase={status.phase} durable={reader.durable_lsn if reader else None} "
            f"applied={apply.applied_lsn if apply else None} lag={status.lag_bytes} bytes"
            f" behind={apply.lag_seconds if apply else None}s"
            + (f" apply_pass={apply_seconds:.1f}s" if apply_seconds is not None else "")
            + f" tables: {tables}")


class Display:
    def __init__(self, local: Local, out: TextIO | None = None, *,
                 interactive: bool | None = None) -> None:
        self.local = local
        self.out = out or sys.stderr
        self.interactive = self.out.isatty() if interactive is None else interactive
        self._drawn = 0
        self._last_key: tuple | None = None
        self._last_log = 0.0

    def show(self, status: PostgresIngestionStatus, elapsed: float, target: int | None, *,
             apply_seconds: float | None = None, final: bool = False) -> None:
        if self.interactive:
            lines = frame(self.local, status, elapsed, target, apply_seconds)
            erase = f"\x1b[{self._drawn}F\x1b[J" if self._drawn else ""
            self.out.write(erase + "\n".join(lines) + "\n")
            self.out.flush()
            self._drawn = 0 if final else len(lines)
            return
        key = (status.phase, tuple((c.type, c.status, c.reason) for c in status.conditions))
        now = time.monotonic()
        if final or key != self._last_key or now - self._last_log >= LOG_EVERY_S:
            log.info("%s", summary_line(status, apply_seconds))
            if key != self._last_key and not final:  # what changed, with the reasons' words
                for line in condition_lines(status):
                    log.info("  %s", line)
            for line in frame(self.local, status, elapsed, target)[2:] if final else ():
                log.info("  %s", line)
            self._last_key, self._last_log = key, now

    def close(self) -> None:
        self._drawn = 0
