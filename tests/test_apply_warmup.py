"""The apply job's warm-up (lakeslot.apply.warmup) on the tests' real Spark session: it runs its
scratch MERGEs through the apply path and small batches through the driver's row delta, compacts
their table as maintenance would, leaves nothing behind — no directory, no catalog conf, no
namespace or table in the ingestion's catalog —, never fails the job, and a second caller
(the apply job after a local run started the warm-up during its snapshot) makes the first end
after its current step and waits for it."""

from __future__ import annotations

import threading

from lakeslot.apply import warmup
from lakeslot.spark.session import make_active


def _namespaces(spark) -> set[str]:
    return {r[0] for r in spark.sql("SHOW NAMESPACES IN lakeslot").collect()}


def test_the_warm_up_merges_on_a_scratch_table_and_leaves_nothing_behind(spark, tmp_path):
    before = _namespaces(spark)
    warmed = warmup.warm_up(spark, tmp_path, again=True)
    assert warmed.merges == warmup.ROUNDS and warmed.compacted
    assert warmed.deltas == warmup.DELTAS  # (each committed by the row delta, not a MERGE)
    assert list(tmp_path.iterdir()) == []
    assert not [k for k, _ in spark.sparkContext.getConf().getAll() if "warmup" in k]
    assert not [r for r in spark.sql("SET").collect() if warmup.CATALOG in r[0]]
    assert _namespaces(spark) == before
    again = warmup.warm_up(spark, tmp_path, again=True)  # (in a catalog of its own)
    assert again.merges == warmup.ROUNDS and list(tmp_path.iterdir()) == []
    assert warmup.warm_up(spark, tmp_path).merges == 0  # a restarted apply job: warm already


def test_a_failing_warm_up_leaves_the_job_cold_but_running(spark, tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    warmed = warmup.warm_up(spark, not_a_directory, again=True)
    assert warmed.merges == 0 and not warmed.compacted


def test_the_scratch_merges_run_only_where_executors_share_the_drivers_files():
    assert warmup.merges_here("local[2]") and warmup.merges_here("local")
    assert not warmup.merges_here("k8s://https://kubernetes.default.svc:443")
    assert not warmup.merges_here("spark://master:7077")


def test_a_second_caller_hurries_the_warm_up_in_progress_and_waits_for_it(spark, tmp_path):
    first: list[warmup.Warmed] = []

    def warm() -> None:
        make_active(spark)
        first.append(warmup.warm_up(spark, tmp_path, again=True))

    application = spark.sparkContext.applicationId
    earlier = warmup._WARMED.get(application)  # (an earlier test's, done)
    thread = threading.Thread(target=warm)
    thread.start()
    while warmup._WARMED.get(application) is earlier:  # until the thread's warm-up began
        thread.join(0.01)
    second = warmup.warm_up(spark, tmp_path)  # (while the first runs: it ends after its step)
    assert second.merges == 0 and first  # (returned once the first had ended)
    assert first[0].merges < warmup.ROUNDS and not first[0].compacted
    assert list(tmp_path.iterdir()) == []
    thread.join()
