"""The apply job's failure handling per table (:mod:`lakeslot.apply.isolation` says what each
kind of failure means and how it ends): a table's work run with retries, its outcome when it fails
— definite, retryable (recorded on its mirror with when it is tried again) or retrying —, the
escalation of a table that keeps failing transiently, the lifting of an error once the table
works again, and the count of passes that fail as a whole in the status document.

Invariants: a failure is recorded only on the failing table's own mirror (never one another
table or ingestion owns: the caller checked ownership first); recording is best effort when the
catalog itself fails (the pass's outcome still says it); nothing here moves a table's position.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from lakeslot.api.naming import IngestionNames, TableName
from lakeslot.api.partitioning import PartitionSpecError
from lakeslot.apply import isolation, merge
from lakeslot.apply.outcomes import WENT_THROUGH, TableOutcome, Totals, now_text
from lakeslot.errors import DefiniteError, transient_in_spark
from lakeslot.mirror import typemap
from lakeslot.spark.session import error_summary
from lakeslot.spark.tables import Tables
from lakeslot.staging import apply_status
from lakeslot.staging.store import Staging

log = logging.getLogger("lakeslot.apply.job")
T = TypeVar("T")


@dataclass(frozen=True)
class Exhausted:
    """Every attempt failed transiently; the last error."""

    error: str


class Failures:
    """One apply job's failure handling (its memory: transient failures in a row per table, and
    the failed tables tried again in this pass)."""

    def __init__(self, tables: Tables, names: IngestionNames, staging: Staging, totals: Totals,
                 max_attempts: int) -> None:
        self.tables, self.names, self.staging, self.totals = tables, names, staging, totals
        self.max_attempts = max_attempts
        self._streaks = isolation.Streaks()
        self.retried_now: set[TableName] = set()  # this pass's: failed tables tried again

    def attempt(self, table: TableName, action: Callable[[], T]) -> T | TableOutcome:
        """``action`` with retries for transient errors; definite errors are recorded."""
        def definite_or_transient() -> T:
            try:
                return action()
            except transient_in_spark() as e:  # an executor's definite error arrives as Spark's
                if (definite := merge.definite_error(e)) is not None:
                    raise definite from None
                raise

        try:
            result = self.retried(str(table), definite_or_transient)
        except (DefiniteError, typemap.MappingError, PartitionSpecError) as e:  # a type, a spec
            # the mirror cannot take are definite too
            return self.fail(table, str(e), getattr(e, "resnapshot", True),
                             getattr(e, "automatic", False))
        except Exception as e:  # any other error of this table's work fails it alone
            log.exception("%s: failed", table)
            return self.retryable(table, f"{type(e).__name__}: {error_summary(e)}")
        if isinstance(result, Exhausted):
            return self.retrying(table, result.error)
        return result

    def retryable(self, table: TableName, error: str) -> TableOutcome:
        """Fail ``table`` alone until its retry time (:mod:`lakeslot.apply.isolation`), recorded
        on its mirror so every status shows it; when the catalog cannot be reached to record it,
        only this pass's outcome says so."""
        target = self.names.mirror_table(table)
        try:
            state = self.tables.load(target)
        except transient_in_spark():
            state = None
        previous = state.retry if state is not None and state.error is not None else None
        failures = previous[1] + 1 if previous is not None else 1
        retry_at = time.time() + isolation.retry_delay_s(failures)
        message = isolation.retry_message(error, failures, retry_at)
        log.error("%s: %s", table, message)
        if state is not None:
            with contextlib.suppress(*transient_in_spark()):
                self.tables.record_error(target, message, state.lsn, False,
                                         retry=(retry_at, failures))
        return TableOutcome(table, target, "failed", state.lsn if state else None, error=message)

    def escalate(self, outcomes: dict[TableName, TableOutcome]) -> None:
        """A table failing transiently pass after pass while others pass is failed alone (it
        would otherwise cost every pass its retries), :data:`isolation.TRANSIENT_STREAK` in a row.
        (A table that is current passes too: its catalog and staging answered.)"""
        passing = any(o.state in WENT_THROUGH for o in outcomes.values())
        for table, outcome in list(outcomes.items()):
            if outcome.state != "retrying":
                self._streaks.passed(table)
            elif self._streaks.failed(table) >= isolation.TRANSIENT_STREAK and passing:
                self._streaks.passed(table)
                outcomes[table] = self.retryable(table, outcome.error or "")

    def recovered(self, outcomes: tuple[TableOutcome, ...]) -> None:
        """Lift the retryable error of each failed table that was tried again and worked."""
        for outcome in outcomes:
            if outcome.source in self.retried_now and outcome.state in WENT_THROUGH:
                log.info("%s: works again; its error is lifted", outcome.source)
                self.tables.clear_error(outcome.target)

    def pass_failed(self, error: Exception) -> None:
        """Count a pass that failed as a whole in the status document (best effort: staging may
        be what fails), :class:`lakeslot.staging.apply_status.PassFailures`."""
        try:
            document = self.staging.read_apply_status() or {}
            failures = apply_status.PassFailures.of(document).failed(
                f"{type(error).__name__}: {error_summary(error)}", dt.datetime.now(dt.UTC))
            document[apply_status.FAILED_PASSES] = failures.document()
            document["updatedAt"] = now_text()
            self.staging.write_apply_status(document)
        except Exception as e:  # noqa: BLE001 - the pass's own error is what matters
            log.warning("cannot record the failed pass in the status document: %s", e)

    def retrying(self, table: TableName, error: str) -> TableOutcome:
        """The outcome of a table whose work failed transiently every time: the next pass
        tries again."""
        target = self.names.mirror_table(table)
        return TableOutcome(table, target, "retrying", self._lsn_or_none(target), error=error)

    def retried(self, what: str, action: Callable[[], T]) -> T | Exhausted:
        """``action``, retried ``max_attempts`` times with backoff while it fails transiently."""
        error = ""
        for attempt in range(self.max_attempts):
            try:
                return action()
            except transient_in_spark() as e:
                error = f"{type(e).__name__}: {error_summary(e)}"
                self.totals.retries[what] = self.totals.retries.get(what, 0) + 1
                log.warning("%s: transient error (attempt %d of %d): %s", what, attempt + 1,
                            self.max_attempts, error)
                if attempt + 1 < self.max_attempts:
                    time.sleep(min(30.0, 2.0 ** attempt))
        return Exhausted(error)

    def _lsn_or_none(self, target: str) -> int | None:
        try:
            return self.tables.lsn(target)
        except transient_in_spark():
            return None

    def fail(self, table: TableName, message: str, resnapshot: bool,
             automatic: bool = False) -> TableOutcome:
        target = self.names.mirror_table(table)
        log.error("%s: stopped: %s", table, message)
        state = self.tables.load(target)
        if state is not None:
            self.tables.record_error(target, message, state.lsn, resnapshot, automatic)
        return TableOutcome(table, target, "failed", state.lsn if state else None,
                            error=message, resnapshot=resnapshot)

