"""Definite and transient errors, one rule for every lakeslot process (DESIGN.md invariant 7).

- **Definite**: retrying or restarting cannot fix it — a publication dropped, a slot lost, a
  table dropped or incompatibly altered, a key that does not identify the rows, a value the
  mirror cannot hold, a timeline changed. It is a :class:`DefiniteError`, whose message says what
  happened and what to do; the specific ones derive from it and carry more (the reader's reason
  word and LSN, :class:`lakeslot.reader.reader.ReaderError`; a table's way out,
  :class:`lakeslot.apply.changes.TableError`; a snapshot gone,
  :class:`lakeslot.snapshot.follower.SnapshotLost`). It stops its table, or the ingestion when it
  belongs to no table, says why in the status, and a process that ends because of it exits with
  :data:`lakeslot.exits.EXIT_DEFINITE`, which no supervisor retries blindly. The status reasons
  that say so are :data:`DEFINITE_REASONS`.
- **Transient**: a retry may cure it — a connection lost, a backend terminated, staging or the
  catalog briefly unavailable, a Spark executor lost. Retried with backoff; nothing is lost, as
  no position moves before the work is durable. Storage, catalog and socket errors
  (:data:`TRANSIENT_IO`) are transient everywhere; each process adds what its own work raises:
  the reader every PostgreSQL error (:data:`TRANSIENT_IN_READER`: the next session's start
  checks re-verify the publication and the slot, so a definite cause shows as the definite error
  it is), the Spark jobs a lost PostgreSQL connection and whatever Spark and py4j raise
  (:func:`transient_in_spark`). The Kubernetes API's answers: :func:`definite_status`.
- **Who decides**: the code that meets the error and knows its cause raises a
  :class:`DefiniteError` there. Crossing from a Spark executor to the driver a definite error
  arrives as one of Spark's (transient-looking) exceptions; its message carries :data:`MARK`
  (:func:`marked`), which :func:`carried` finds again. What is neither definite nor transient is
  the caller's to judge (the apply job fails the table and tries it again later; the reader
  ends as crashed, exit 1).

Base layer: imports no other lakeslot module, and neither pyspark nor py4j until
:func:`transient_in_spark` is called (the Spark-free rooms import this module).
"""

from __future__ import annotations

import functools

import psycopg


class DefiniteError(Exception):
    """Retrying cannot help; ``message`` says what happened and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# Transient: storage (staging), the catalog and sockets, in every process.
TRANSIENT_IO: tuple[type[Exception], ...] = (OSError,)
# The reader: any PostgreSQL error ends the session; the next session's checks re-verify.
TRANSIENT_IN_READER: tuple[type[Exception], ...] = (psycopg.Error, *TRANSIENT_IO)


@functools.cache
def transient_in_spark() -> tuple[type[Exception], ...]:
    """What a retry may cure in a Spark job: Spark and py4j (an executor lost; an executor's
    definite error arrives this way too and is told apart by :func:`carried`), storage and catalog
    I/O, PostgreSQL connections. Imports pyspark when first called."""
    from py4j.protocol import Py4JError
    from pyspark.errors.exceptions.captured import PythonException

    return (Py4JError, PythonException, *TRANSIENT_IO, psycopg.OperationalError)


MARK = "lakeslot definite error: "  # marks an executor's error that is not transient


def marked(message: str) -> str:
    """``message`` as an executor raises it through Spark: :func:`carried` finds it again."""
    return f"{MARK}{message}"


def carried(error: BaseException) -> str | None:
    """The definite error's message that ``error`` — as Spark delivers an executor's error to
    the driver — carries (its first line after :data:`MARK`), None when it carries none."""
    text = str(error)
    if MARK not in text:
        return None
    return text.split(MARK, 1)[1].splitlines()[0]


# Status condition reasons that waiting will not fix: the user must act (the message says how).
DEFINITE_REASONS = ("InvalidSpec", "SlotLost", "SlotUnusable")
# The Kubernetes API answers that the next attempt resolves: 409 Conflict, 429 Too Many Requests.
RETRIED_STATUSES = (409, 429)


def definite_status(status: int | None) -> bool:
    """Whether the Kubernetes API refused a write for good: a 4xx that retrying does not fix
    (any other failure is tried again by the next reconcile)."""
    return status is not None and 400 <= status < 500 and status not in RETRIED_STATUSES
