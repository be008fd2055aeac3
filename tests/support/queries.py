"""Counting the statements code runs on a connection: what a check costs in round trips, which
must not grow with the tables it checks (asserted as counts, never as time)."""

from __future__ import annotations

import psycopg


def counted(conn: psycopg.Connection) -> list:
    """The statements ``conn.execute`` runs from now on, appended to the returned list."""
    queries: list = []
    execute = conn.execute

    def counting(query, params=None, **kwargs):
        queries.append(query)
        return execute(query, params, **kwargs)

    conn.execute = counting  # type: ignore[method-assign]
    return queries
