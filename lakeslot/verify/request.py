"""What a check is asked to do: the tables, named as a person writes them.

Invariants: a table name is ``SCHEMA.NAME`` as PostgreSQL reads it — each part plain (folded to
lower case) or double-quoted (kept as written, ``""`` for a quote) — so what ``psql`` accepts
names the same table here, and ``str(TableName)`` (quoted like psql) reads back as itself.

Failure modes: a text that is not such a name raises ``ValueError`` saying what is expected.
"""

from __future__ import annotations

import re

from lakeslot.source.tables import TableName

_IDENTIFIER = re.compile(r'"((?:[^"]|"")+)"|([^".]+)')


def parse_table(text: str) -> TableName:
    """``SCHEMA.NAME`` as PostgreSQL reads it: each part plain (folded to lower case) or
    double-quoted (kept as written, ``""`` for a quote). Raises ``ValueError``."""
    parts, position = [], 0
    while True:
        match = _IDENTIFIER.match(text, position)
        if match is None:
            break
        quoted, bare = match.groups()
        parts.append(quoted.replace('""', '"') if quoted is not None else bare.strip().lower())
        position = match.end()
        if position == len(text) or text[position] != ".":
            break
        position += 1
    if position != len(text) or len(parts) != 2 or not all(parts):
        raise ValueError(f"--table {text!r}: expected SCHEMA.NAME (quote parts that need it, "
                         'e.g. \'"My Schema"."My Table"\')')
    return TableName(parts[0], parts[1])
