"""Scalar field types of the API, each carrying its constraints for pydantic and the CRD alike.

- :data:`Identifier`: a PostgreSQL identifier (schema, table, column, publication, role, database
  name) as PostgreSQL stores it, *without* quotes: any non-empty text of at most 63 bytes of UTF-8
  (``NAMEDATALEN - 1``; PostgreSQL silently truncates longer names, which would make lakeslot
  address a different object). Upper case, spaces, quotes, reserved words and non-ASCII are all
  legal. The CRD bounds the length in characters (``maxLength``, needed for CEL cost estimates)
  and in bytes (a CEL rule).
- :data:`SlotName`: replication slot names, which PostgreSQL restricts to ``[a-z0-9_]``.
- :data:`Lsn`: a WAL position in PostgreSQL's text form ``X/XXXXXXXX`` (upper-case hex, no leading
  zeros, as ``pg_lsn`` prints it); ``lakeslot.lsn`` converts to and from the 64-bit integer.
- :data:`Quantity`: a Kubernetes resource quantity (integer or string such as ``500m``, ``1Gi``).
- :data:`KubeTime`: an RFC 3339 time with a zone, normalised to UTC whole seconds like
  ``metav1.Time``; naive datetimes are rejected rather than guessed.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, PlainSerializer, PlainValidator, Strict, StringConstraints, WithJsonSchema
from pydantic_core import PydanticCustomError

from lakeslot.api.rules import Rule

IDENTIFIER_MAX_BYTES = 63  # NAMEDATALEN - 1

identifier_bytes = Rule(
    cel=f"size(bytes(self)) <= {IDENTIFIER_MAX_BYTES}",
    message=f"longer than {IDENTIFIER_MAX_BYTES} bytes (PostgreSQL would truncate it)",
    fix=f"shorten it to at most {IDENTIFIER_MAX_BYTES} bytes of UTF-8; non-ASCII characters take 2 to 4 bytes each",
    check=lambda value: len(value.encode()) <= IDENTIFIER_MAX_BYTES,
)

Identifier = Annotated[str, StringConstraints(min_length=1, max_length=IDENTIFIER_MAX_BYTES), identifier_bytes]

SlotName = Annotated[str, StringConstraints(min_length=1, max_length=IDENTIFIER_MAX_BYTES, pattern=r"^[a-z0-9_]+$")]

KubeName = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    ),
]

KubeLabel = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")]

SecretKey = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]

SparkMemory = Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]*[kmgt]$")]

LSN_PATTERN = r"^[0-9A-F]{1,8}/[0-9A-F]{1,8}$"
Lsn = Annotated[str, StringConstraints(pattern=LSN_PATTERN)]


QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def _quantity(value: Any) -> int | str:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if (is_int and value >= 0) or (isinstance(value, str) and re.fullmatch(QUANTITY_PATTERN, value)):
        return value
    raise PydanticCustomError(
        "quantity", "not a Kubernetes quantity (a non-negative integer or a string such as 500m or 1Gi)"
    )


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "description": "A Kubernetes quantity: an integer, or a string such as 500m, 2, 256Mi or 1Gi.",
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "minimum": 0,
            "pattern": QUANTITY_PATTERN,
        }
    ),
]


def _utc_seconds(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise PydanticCustomError("naive_datetime", "time has no zone (write it in UTC with a Z suffix)")
    return value.astimezone(UTC).replace(microsecond=0)


KubeTime = Annotated[
    datetime,
    Strict(False),
    AfterValidator(_utc_seconds),
    PlainSerializer(lambda value: value.strftime("%Y-%m-%dT%H:%M:%SZ"), return_type=str),
]
