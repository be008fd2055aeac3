"""What a check is asked to do: the tables, named as a person writes them, and — for the
operator's verification Job — the request token it answers.

Invariants:

- A table name is ``SCHEMA.NAME`` as PostgreSQL reads it — each part plain (folded to lower
  case) or double-quoted (kept as written, ``""`` for a quote) — so what ``psql`` accepts names
  the same table here, and ``str(TableName)`` (quoted like psql) reads back as itself. A list of
  names (:func:`parse_tables`) separates them with commas outside quotes.
- A token (:func:`check_token`) is 1 to 63 characters of letters, digits, ``.``, ``_``, ``:`` and
  ``-``, starting and ending with a letter or digit: safe as a file name in staging and in a
  command line, and long enough for a timestamp or a UUID.

Failure modes: a text that is not a name, a list of names or a token raises ``ValueError`` saying
what is expected.
"""

from __future__ import annotations

import re

from lakeslot.api.naming import TableName

_IDENTIFIER = re.compile(r'"((?:[^"]|"")+)"|([^".]+)')
_LIST_ENTRY = re.compile(r'(?:"(?:[^"]|"")*"|[^",])+')
TOKEN_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._:-]{0,61}[A-Za-z0-9])?$"


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
        raise ValueError(f"{text!r}: expected SCHEMA.NAME (quote parts that need it, "
                         'e.g. \'"My Schema"."My Table"\')')
    return TableName(parts[0], parts[1])


def parse_tables(text: str) -> list[TableName]:
    """Names separated by commas (outside double quotes), each read by :func:`parse_table`;
    spaces around an entry are ignored, an empty text is no table. Raises ``ValueError``."""
    if not text.strip():
        return []
    entries, position = [], 0
    while True:
        match = _LIST_ENTRY.match(text, position)
        entry = match.group() if match else ""
        if not entry.strip():
            raise ValueError(f"{text!r}: an empty entry; expected SCHEMA.NAME entries separated by "
                             "commas")
        entries.append(parse_table(entry.strip()))
        position += len(entry)
        if position == len(text):
            return entries
        position += 1  # the comma


def check_token(text: str) -> str:
    """``text`` when it is a valid token (see the module docstring); else ``ValueError``."""
    if not re.fullmatch(TOKEN_PATTERN, text):
        shown = text if len(text) <= 80 else text[:79] + "…"
        raise ValueError(f"{shown!r} is not a token: use 1 to 63 letters, digits, '.', '_', ':' or "
                         "'-', starting and ending with a letter or digit (for example the output "
                         "of date -u +%Y%m%dT%H%M%SZ)")
    return text
