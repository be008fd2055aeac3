"""What a streaming ``lakeslot run`` copies, online (lakeslot.local.schedule.copy_plan): the
operator's decision (lakeslot.control.scheduling.plan) over the tables the running apply job
handles, table-driven, and when Schedule.next_copy reads the mirrors to decide (their reads
counted, no catalog). Pure: tests/test_local_new_tables.py and tests/test_local_resnapshot.py run
the copies end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import yaml

from lakeslot.api.naming import TableName
from lakeslot.control import scheduling
from lakeslot.local import config
from lakeslot.local.schedule import Schedule, copy_plan
from lakeslot.local.selection import Selection
from lakeslot.mirror import progress as mirror_progress
from lakeslot.mirror.progress import MirrorProgress

A = TableName("public", "a")
B = TableName("public", "b")
C = TableName("public", "c")


@dataclass(frozen=True)
class Case:
    id: str
    apply_tables: tuple[TableName, ...]
    applied: dict[TableName, int | None]  # each selected table's lakeslot.lsn
    wanted: tuple[TableName, ...]
    due: frozenset[TableName] = frozenset()
    again: dict[TableName, int] = field(default_factory=dict)
    min_snapshot_lsn: int = 0


CASES = [
    Case("nothing joined, nothing to copy again", (A, B), {A: 100, B: 200}, wanted=()),
    Case("a joined table the apply job waits for is copied", (A, B), {A: 100, B: None},
         wanted=(B,), due=frozenset({B})),
    Case("a joined table waiting out its backoff is not", (A, B), {A: 100, B: None}, wanted=()),
    Case("a joined table the apply job does not handle yet waits for its restart", (A,),
         {A: 100, B: None}, wanted=(), due=frozenset({B})),
    Case("a table copied again, from past its position", (A, B), {A: 100, B: 200}, wanted=(B,),
         again={B: 201}, min_snapshot_lsn=201),
    Case("copied again together with a joined table", (A, B, C), {A: 100, B: 200, C: None},
         wanted=(B, C), due=frozenset({C}), again={B: 201}, min_snapshot_lsn=201),
    Case("a table to copy again that the apply job does not handle waits", (A,),
         {A: 100, B: 200}, wanted=(), again={B: 201}),
    Case("a table that left the selection is not copied", (A, B), {A: 100}, wanted=(),
         due=frozenset({B}), again={B: 201}),
    Case("a mirror gone under the apply job is not the schedule's to copy", (A, B),
         {A: 100, B: None}, wanted=()),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_copy_plan(case):
    plan = copy_plan(case.apply_tables, case.applied, case.due, case.again)
    assert plan.wanted == case.wanted
    assert plan.min_snapshot_lsn == case.min_snapshot_lsn
    assert plan.idle == (not case.wanted)


def test_a_joined_table_is_copied_whatever_the_snapshot_mode():
    # The one difference from the operator kept explicit (schedule.STREAMING): under
    # snapshot.mode never the operator's plan copies no table without a mirror; local mode's
    # start copies every table, and a table that joins while it streams is copied the same way.
    applied: dict[TableName, int | None] = {A: 100, B: None}
    assert copy_plan((A, B), applied, {B}, {}).wanted == (B,)
    assert scheduling.plan([A, B], applied, scheduling.Request(mode="never")).wanted == ()


def test_the_first_decision_waits_for_the_first_apply_pass(tmp_path, monkeypatch):
    # The run's start has just read every mirror (streaming_tables) and only a pass marks a
    # table: next_copy reads the mirrors once per finished pass, the first after the first
    # pass (at 1,000 mirrors on a network catalog a read before it held that pass back).
    document = {
        "apiVersion": "lakeslot.io/v1alpha1", "kind": "PostgresIngestion",
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": {"source": {"host": "127.0.0.1", "database": "shop", "user": "lakeslot",
                            "passwordSecretRef": {"name": "pg", "key": "password"},
                            "tables": [{"name": "a"}, {"name": "b"}]},
                 "sink": {"catalog": {"type": "hadoop", "warehouse": f"file://{tmp_path}/w"},
                          "namespace": "shop"},
                 "staging": {"uri": f"file://{tmp_path}/staging"}},
    }
    path = tmp_path / "ingestion.yaml"
    path.write_text(yaml.safe_dump(document))
    local = config.load(str(path), state_dir=str(tmp_path / "state"),
                        environ={"LAKESLOT_SOURCE_PASSWORD": "unused: no source is asked"})
    selection = Selection(local, interval=1.0)
    selection.tables = [A, B]
    reads = []

    def read(ingestion, tables, secrets=None):
        reads.append(tuple(tables))
        return {t: MirrorProgress(lsn=100, rows=1, committed_at_ms=None) for t in tables}

    monkeypatch.setattr(mirror_progress, "read", read)
    schedule = Schedule(local, selection)
    schedule.apply_tables = (A, B)
    assert schedule.next_copy(passes=0) is None
    assert reads == [] and schedule.progress_read(0) is None
    assert schedule.next_copy(passes=1) is None  # every mirror current: nothing to copy
    assert reads == [(A, B)]
    assert schedule.next_copy(passes=1) is None  # no pass since: no read
    assert reads == [(A, B)]
    # until the next pass, the status takes the mirrors as that read found them
    assert schedule.progress_read(1) == read(local.ingestion, [A, B])
    assert schedule.progress_read(2) is None
