"""The changelog table of a mirror (lakeslot.apply.changelog): its schema, and the position it
appends from — its own, never below its mirror's — on a real Iceberg catalog."""

from __future__ import annotations

import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from lakeslot.api.models import PostgresIngestion
from lakeslot.api.naming import TableName
from lakeslot.apply.changelog import Changelog, changelog_schema
from lakeslot.mirror.contract import LSN_COLUMN, OP_COLUMN, SEQ_COLUMN, TableState
from lakeslot.spark.tables import Tables
from tests.support.operator_env import OfflineDatabase, ingestion_document

MIRROR = Schema(NestedField(1, "id", LongType(), required=True),
                NestedField(2, "note", StringType(), required=False),
                NestedField(3, LSN_COLUMN, LongType(), required=True),
                identifier_field_ids=[1])


def test_the_changelog_has_the_mirrors_columns_optional_and_unkeyed_then_lsn_op_seq():
    """A key is repeated in a history, and a delete's image carries only the key."""
    schema = changelog_schema(MIRROR)
    assert [(f.field_id, f.name, f.required) for f in schema.fields] == [
        (1, "id", False), (2, "note", False),
        (4, LSN_COLUMN, True), (5, OP_COLUMN, True), (6, SEQ_COLUMN, True)]
    assert not schema.identifier_field_ids


class _Asked(Exception):
    """Raised by the events callback, with the position the changelog asked from."""


def _ask(position: int):
    raise _Asked(position)


def _positions(spark, tables: Tables, name: str) -> list[int]:
    """The ``lakeslot.lsn`` of every commit of the table, in order."""
    rows = spark.sql(f"SELECT summary['lakeslot.lsn'] AS lsn FROM "
                     f"{tables.qualified(name)}.snapshots").collect()
    return sorted(int(r.lsn) for r in rows)


def test_the_changelog_appends_above_its_own_position_never_below_its_mirrors(spark,
                                                                              iceberg_namespace):
    catalog, namespace = iceberg_namespace.split(".", 1)
    document = ingestion_document("history", OfflineDatabase(), [TableName("public", "t")],
                                  warehouse="/tmp/wh", staging="file:///tmp/staging")
    spec = PostgresIngestion.model_validate(document).spec
    tables = Tables(spark, catalog, namespace)
    changelog = Changelog(spark, spec, tables)
    name = "t" + spec.sink.changelog.suffix

    def mirror_at(lsn: int) -> TableState:
        if tables.load("t") is None:
            tables.create("t", MIRROR, {}, lsn)
        else:
            tables.advance("t", lsn)
        state = tables.load("t")
        assert state is not None
        return state

    # first use: created at its mirror's position, then at the batch's end (no change of it)
    changelog.append("t", mirror_at(100), 200, None, None)
    assert _positions(spark, tables, name) == [100, 200]
    # a crash after the changelog's commit, before the MERGE: the same batch again appends nothing
    changelog.append("t", mirror_at(100), 200, None, _ask)
    assert _positions(spark, tables, name) == [100, 200]
    # the next batch: the changes above the changelog's position
    with pytest.raises(_Asked) as asked:
        changelog.append("t", mirror_at(200), 300, None, _ask)
    assert asked.value.args == (200,)
    # the mirror copied again (at 500) while the changelog stayed behind: from the mirror's
    with pytest.raises(_Asked) as asked:
        changelog.append("t", mirror_at(500), 600, None, _ask)
    assert asked.value.args == (500,)
    assert _positions(spark, tables, name) == [100, 200]  # (nothing read)
