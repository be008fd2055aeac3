"""What an apply pass reads from the source (lakeslot.apply.source_tables), against real
PostgreSQL: one view per pass, and a DDL message's missing value over the catalog's."""

from __future__ import annotations

from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.apply.source_tables import SourceTables
from lakeslot.workloads import JobInput
from tests.support.fixtures_pg import connection_settings
from tests.support.operator_env import ingestion_document

T = TableName("public", "t")


def _sources(pgdb) -> SourceTables:
    document = ingestion_document("sources", pgdb, [T], warehouse="/tmp/wh",
                                  staging="file:///tmp/staging")
    job = JobInput(PostgresIngestion.model_validate(document), (T,))
    return SourceTables(job, connection_settings(pgdb))


def _columns(sources: SourceTables) -> set[str]:
    facts = sources.current_facts()[T]
    assert facts is not None
    return set(facts.columns)


def test_a_pass_sees_one_catalog_and_a_ddl_messages_missing_value_wins_within_it(pgdb):
    with pgdb.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES (1)")
        # a volatile default: PostgreSQL rewrites the table (and no missing value is kept) ...
        conn.execute("ALTER TABLE t ADD COLUMN stamped timestamptz DEFAULT clock_timestamp()")
        # ... a constant one is the existing rows' "missing value"
        conn.execute("ALTER TABLE t ADD COLUMN seven int DEFAULT 7")
    sources = _sources(pgdb)
    try:
        sources.new_pass()
        assert sources.missing_values(T, ["seven", "stamped", "gone"]) == ({"seven": "7"}, ["stamped"])
        columns = _columns(sources)
        with pgdb.connect() as conn:
            conn.execute("ALTER TABLE t ADD COLUMN later int DEFAULT 8")
            conn.execute("ALTER TABLE t ALTER COLUMN seven SET DEFAULT 9")  # (the missing value stays)
        # the rest of the pass judges every table by what it read first
        assert _columns(sources) == columns
        assert sources.missing_values(T, ["later"]) == ({}, [])
        sources.record_missing(T, {"seven": "6", "later": None})  # exact at the messages' ADD
        assert sources.missing_values(T, ["seven", "later"]) == ({"seven": "6"}, [])

        sources.new_pass()  # the next pass reads the catalog again
        assert _columns(sources) == columns | {"later"}
        assert sources.missing_values(T, ["seven", "later"]) == ({"seven": "7", "later": "8"}, [])
    finally:
        sources.close()
