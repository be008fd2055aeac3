"""The reduction of an apply pass's batch: every table with changes reduced on the executors in
one Spark job (:func:`lakeslot.apply.spread.reduce`) — the small batches the driver applies
itself, by the driver —, and the narrowing down to the tables it fails for when it fails.

Invariants (:mod:`lakeslot.apply.isolation`):

- A batch that reduces is reduced once, for every table at once: one Spark job per pass, not
  one per table (and one fold on the driver, for the tables it reduces itself).
- When that job fails (after the transient retries of :meth:`lakeslot.apply.failures.Failures.retried`),
  the tables are reduced in halves, and halves again (:func:`lakeslot.apply.isolation.halves`),
  until each table it fails for is found alone: that table's error is classified as any work of
  the table (definite, retryable or retrying) and becomes its outcome; the tables of every half
  that works are reduced and go on in the same pass.
- Nothing here commits: a table left out has no reduction, and its position does not move.

Failure modes: none of its own — a failure becomes the outcome of the table it belongs to, or
is retried; a table's reduction may still carry its definite error (a ``problem``), which the
table's pass raises (:meth:`lakeslot.apply.table_pass.TablePass.apply`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from lakeslot.api.naming import TableName
from lakeslot.apply import spread
from lakeslot.apply.failures import Exhausted, Failures
from lakeslot.apply.isolation import halves
from lakeslot.apply.outcomes import TableOutcome
from lakeslot.spark.session import error_summary
from lakeslot.staging.store import Staging

log = logging.getLogger("lakeslot.apply.job")


class Reduction:
    """How one apply job reduces its batches."""

    def __init__(self, spark, staging: Staging, failures: Failures) -> None:
        self.spark, self.staging, self.failures = spark, staging, failures
        self.staging_uri = staging.uri  # (what the executors open)

    def reduce(self, batch: spread.Batch, configs: list[spread.TableConfig],
               outcomes: dict[TableName, TableOutcome], here: frozenset[TableName] = frozenset()
               ) -> dict[TableName, spread.Reduced]:
        """Reduce every table of ``configs`` in one Spark job (:mod:`lakeslot.apply.spread`) —
        those of ``here`` by the driver itself, reading the batch through the driver's staging
        (:mod:`lakeslot.apply.segment_cache`) —, retried like a table's work. When it cannot
        be had, the tables are reduced in halves, and halves again, until the tables it fails
        for are found alone: those fail (or are ``retrying``: their outcomes are put in
        ``outcomes``), the others go on (:mod:`lakeslot.apply.isolation`). Each table's
        reduction, by table."""
        found: dict[TableName, spread.Reduced] = {}
        for on_driver in (True, False):
            group = [c for c in configs if (c.table in here) == on_driver]
            if group:
                found.update(self._reduce(batch, group, outcomes, functools.partial(
                    spread.reduce, here=self.staging if on_driver else None)))
        return found

    def _reduce(self, batch: spread.Batch, configs: list[spread.TableConfig],
                outcomes: dict[TableName, TableOutcome], how: Callable[..., spread.Reduced]
                ) -> dict[TableName, spread.Reduced]:
        try:
            reduced = self.failures.retried("reducing the batch", functools.partial(
                how, self.spark, self.staging_uri, batch, configs))
        except Exception as e:  # noqa: BLE001 - found out table by table below
            log.warning("reducing the batch failed (%s): reducing its tables in parts",
                        error_summary(e))
        else:
            if not isinstance(reduced, Exhausted):
                return {c.table: reduced for c in configs}
            log.warning("reducing the batch kept failing (%s): reducing its tables in parts",
                        reduced.error)
        return self._parts(batch, configs, outcomes, how)

    def _parts(self, batch: spread.Batch, configs: list[spread.TableConfig],
               outcomes: dict[TableName, TableOutcome], how: Callable[..., spread.Reduced]
               ) -> dict[TableName, spread.Reduced]:
        if len(configs) == 1:  # alone: its own error, classified as any work of the table
            table = configs[0].table
            alone = self.failures.attempt(table, functools.partial(
                how, self.spark, self.staging_uri, batch, configs))
            if isinstance(alone, TableOutcome):
                outcomes[table] = alone
                return {}
            return {table: alone}
        found: dict[TableName, spread.Reduced] = {}
        for part in halves(configs):
            try:
                reduced = how(self.spark, self.staging_uri, batch, part)
            except Exception:  # noqa: BLE001 - narrowed down further
                found.update(self._parts(batch, list(part), outcomes, how))
            else:
                found.update((c.table, reduced) for c in part)
        return found
