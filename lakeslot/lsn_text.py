"""PostgreSQL log sequence numbers: 64-bit integers, written ``X/XXXXXXXX`` by PostgreSQL.

Everything inside lakeslot holds LSNs as ``int``; text appears only at the edges (SQL, status,
segment names). ``parse`` accepts exactly PostgreSQL's form and raises ``ValueError`` otherwise,
so a corrupted status or file name never turns into a silently wrong position.
:func:`human_bytes` writes a distance between two LSNs (bytes of WAL) for people.
"""

from __future__ import annotations

import re

_LSN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def parse(text: str) -> int:
    m = _LSN.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not a PostgreSQL LSN: {text!r} (expected e.g. '0/16B3748')")
    return (int(m.group(1), 16) << 32) | int(m.group(2), 16)


def format(lsn: int) -> str:  # noqa: A001 - mirrors PostgreSQL's name for the text form
    if not 0 <= lsn < 1 << 64:
        raise ValueError(f"LSN out of range: {lsn}")
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def optional(lsn: int | None) -> str | None:
    """:func:`format` of an LSN that may be unknown (None stays None)."""
    return None if lsn is None else format(lsn)


def human_bytes(n: int | None) -> str:
    """Bytes (of WAL, a lag) for people: ``950 B``, ``1.5 MB``; ``-`` for None."""
    if n is None:
        return "-"
    size: float = n
    for unit in ("B", "kB", "MB", "GB"):
        if abs(size) < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return str(size)
