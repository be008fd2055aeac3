"""The result of the exact check, and its two forms: text for people (``lakeslot verify``) and a
JSON document for machines (``lakeslot verify -o json``, and the operator's verification result).

Invariants:

- Per table the result lists missing rows (in the source, not in the mirror), extra rows (in the
  mirror, not in the source) and differing rows by key, with counts; a key held by more rows on
  one side than on the other counts as missing or extra (:mod:`.diff`). Counts are complete; the
  first :data:`lakeslot.verify.diff.LISTED_KEYS` keys of each kind are listed (differing rows
  with the columns that differ, source and mirror value).
- A table's result is ``equal``, ``different`` (rows differ, or the mirror lacks source
  columns) or ``incomplete`` (the check could not finish: ``problem`` says why). Keys still
  changing after the last round are listed as not compared, never counted against equality.
- Every round is recorded with its source snapshot ``P``, the mirror position ``L`` it read,
  what it settled and what it left in flight, so a result says at which LSNs it holds.
- The JSON document (:func:`to_document`) has camelCase keys, LSNs in PostgreSQL's text form and
  plain JSON values (:func:`lakeslot.verify.diff.plain`); its fields are a contract with its
  readers (users' scripts, the operator).
- A verification the operator requested ends with a result document in staging
  (:func:`result_document`): the token it answers, when it ran, its exit code, and the result or
  the error that kept it from one — written whatever the outcome, so the operator never waits
  for a check that has ended.

Failure modes: none (pure formatting).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime

from lakeslot import lsn_text
from lakeslot.api.naming import TableName
from lakeslot.exits import EXIT_FAILED, EXIT_OK
from lakeslot.verify.diff import LISTED_KEYS


@dataclass
class Keys:
    """How many keys of one kind, and the first :data:`LISTED_KEYS` of them (``{column: value}``;
    for differing rows also ``columns``: ``{column: [source value, mirror value]}``)."""

    count: int = 0
    listed: list[dict] = field(default_factory=list)

    def add(self, entries: list[dict], count: int | None = None) -> None:
        self.count += len(entries) if count is None else count
        self.listed.extend(entries[:max(0, LISTED_KEYS - len(self.listed))])


@dataclass(frozen=True)
class Round:
    number: int
    source_lsn: int  # P: the source snapshot
    mirror_lsn: int | None  # L: lakeslot.lsn of the mirror snapshot read (None: not reached)
    compared: int  # keys whose comparison this round settled
    in_flight: int | None  # keys changed in (P, L] among those read (None: the whole table)
    note: str = ""  # why the round settled nothing, if it did not


@dataclass
class TableResult:
    table: TableName
    source_rows: int | None = None  # in the source at the first round's P
    mirror_rows: int | None = None  # in the mirror at the first round's L
    compared: int = 0  # keys compared and settled (equal or not), over all rounds
    missing: Keys = field(default_factory=Keys)  # in the source, not in the mirror
    extra: Keys = field(default_factory=Keys)  # in the mirror, not in the source
    differing: Keys = field(default_factory=Keys)
    not_compared: Keys = field(default_factory=Keys)  # still in flight after the last round
    not_compared_reason: str | None = None  # why, when not simply changing continuously
    lacking_columns: list[str] = field(default_factory=list)  # source columns the mirror lacks
    problem: str | None = None  # why the check could not complete (or the columns differ)
    rounds: list[Round] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return self.missing.count + self.extra.count + self.differing.count

    @property
    def result(self) -> str:
        """``equal``, ``different`` (rows differ, or the mirror lacks source columns) or
        ``incomplete`` (the check could not finish: the reason is ``problem``). Keys that were
        still changing after the last round are listed, not counted against equality."""
        if self.differences or self.lacking_columns:
            return "different"
        return "incomplete" if self.problem else "equal"


@dataclass(frozen=True)
class Verification:
    tables: list[TableResult]

    @property
    def equal(self) -> bool:
        return all(t.result == "equal" for t in self.tables)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.equal else EXIT_FAILED


def lsn_or_dash(value: int | None) -> str:
    """An LSN that may be unknown, for people (``-``)."""
    return lsn_text.format(value) if value is not None else "-"


def to_document(verification: Verification) -> dict:
    """The JSON output of ``lakeslot verify -o json``."""
    def keys(k: Keys) -> dict:
        return {"count": k.count, "keys": k.listed}

    return {
        "equal": verification.equal,
        "tables": [{
            "schema": t.table.schema, "name": t.table.name, "table": str(t.table),
            "result": t.result, "problem": t.problem,
            "rowsCompared": t.compared, "sourceRows": t.source_rows, "mirrorRows": t.mirror_rows,
            "missing": keys(t.missing), "extra": keys(t.extra), "differing": keys(t.differing),
            "notCompared": {**keys(t.not_compared), "reason": _not_compared_reason(t)},
            "lackingColumns": t.lacking_columns,
            "rounds": [{"round": r.number, "sourceLsn": lsn_text.format(r.source_lsn),
                        "mirrorLsn": lsn_or_dash(r.mirror_lsn) if r.mirror_lsn is not None else None,
                        "compared": r.compared, "inFlight": r.in_flight, "note": r.note or None}
                       for r in t.rounds],
        } for t in verification.tables],
    }


def result_document(token: str, *, started_at: datetime, finished_at: datetime, exit_code: int,
                    verification: Verification | None = None, error: str | None = None) -> dict:
    """What a verification Job leaves in staging for the operator
    (:meth:`lakeslot.staging.store.Staging.write_verify_result`): the request ``token`` it
    answers, when it ran (RFC 3339, UTC), its exit code (:mod:`lakeslot.exits`) and the result
    (:func:`to_document`) or the ``error`` that kept it from one."""
    return {"token": token, "startedAt": _time(started_at), "finishedAt": _time(finished_at),
            "exitCode": exit_code, "error": error,
            "result": to_document(verification) if verification is not None else None}


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_compared_reason(t: TableResult) -> str | None:
    if not t.not_compared.count:
        return None
    return t.not_compared_reason or "changing continuously"


def key_text(key: dict) -> str:
    """A listed key for people: ``id=7, region="eu"``."""
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in key.items())


def _short(value: object, width: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[:width - 1] + "…"


def render_text(verification: Verification) -> list[str]:
    """The text output of ``lakeslot verify``: a table per source table, then the keys."""
    header = ("table", "result", "rows compared", "missing", "extra", "differing", "not compared")
    rows = [header] + [
        (str(t.table), t.result.upper() if t.result != "equal" else "equal", f"{t.compared:,}",
         f"{t.missing.count:,}", f"{t.extra.count:,}", f"{t.differing.count:,}",
         f"{t.not_compared.count:,}")
        for t in verification.tables]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in rows]
    for t in verification.tables:
        details = []
        if t.rounds:
            first, last = t.rounds[0], t.rounds[-1]
            details.append(f"  source snapshot {lsn_text.format(first.source_lsn)}, mirror at "
                           f"{lsn_or_dash(first.mirror_lsn)}; {len(t.rounds)} round(s), last at "
                           f"{lsn_text.format(last.source_lsn)}")
        if t.problem:
            details.append(f"  {t.problem}")
        for title, k in (("missing (in the source, not in the mirror)", t.missing),
                         ("extra (in the mirror, not in the source)", t.extra),
                         (f"not compared ({_not_compared_reason(t)})", t.not_compared)):
            if k.count:
                more = f" (first {len(k.listed)})" if k.count > len(k.listed) else ""
                details.append(f"  {title}: {k.count:,}{more}: "
                               + "; ".join(key_text(key) for key in k.listed))
        if t.differing.count:
            more = f" (first {len(t.differing.listed)})" if t.differing.count > len(t.differing.listed) else ""
            details.append(f"  differing: {t.differing.count:,}{more}:")
            for entry in t.differing.listed:
                changes = ", ".join(f"{c}: source {_short(v[0])} ≠ mirror {_short(v[1])}"
                                    for c, v in entry["columns"].items())
                details.append(f"    {key_text(entry['key'])}: {changes}")
        if details and (t.result != "equal" or t.not_compared.count):
            lines += [f"{t.table}:", *details]
    summary = sum(t.result == "different" for t in verification.tables), \
        sum(t.result == "incomplete" for t in verification.tables)
    if verification.equal:
        lines.append(f"every table is equal ({len(verification.tables)} table(s))")
    else:
        lines.append(f"{summary[0]} table(s) differ, {summary[1]} could not be checked")
    return lines
