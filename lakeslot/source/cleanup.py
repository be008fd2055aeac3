"""What deleting an ingestion does to the source, per its deletionPolicy.

``Retain`` leaves slot and publication in place (the slot keeps retaining WAL: status and the
documentation say so). ``Delete`` drops the slot (terminating its holder) and the publication if this
ingestion created it and ``publicationManagement`` is not ``External`` — never a publication a DBA
created. Both are idempotent: running cleanup again after success is a no-op.
"""

from __future__ import annotations

import psycopg

from lakeslot.source import publication, slot


def cleanup(conn: psycopg.Connection, *, slot_name: str, publication_name: str, owner: str,
            deletion_policy: str,
            publication_management: publication.Management = "Auto") -> dict[str, str]:
    """Returns what happened to each object, e.g. {"slot": "dropped", "publication": "absent"}."""
    if deletion_policy == "Retain":
        return {"slot": "retained", "publication": "retained"}
    if deletion_policy != "Delete":
        raise ValueError(f"unknown deletionPolicy {deletion_policy!r} (Retain or Delete)")
    return {"slot": slot.drop(conn, slot_name),
            "publication": publication.drop(conn, publication_name, owner=owner,
                                            setting=publication_management)}
