"""lakeslot's Java helpers (lakeslot/spark/helpers.py): built where a JDK is and loaded by the
session — the local file system, writing the same files with the same modes as Hadoop's own
without a process per file, and the row delta's RowDeltas beside Iceberg's classes; without a
JDK, neither. Real Spark session (the suite's), real Hadoop file systems on local disk (the row
delta's commits through RowDeltas: tests/test_row_delta.py, tests/test_small_batches.py)."""

from __future__ import annotations

import os
import shutil
import stat
import threading

import pytest

from lakeslot.spark import helpers, row_delta


@pytest.fixture(scope="module")
def built():
    if shutil.which("javac") is None:
        pytest.skip("no javac here (./dev setup installs openjdk-17-jdk-headless): the stock file system is used")
    built = helpers.ensure_built()
    assert built is not None and all(jar.is_file() for jar in built)
    return built


def _modes(fs, jvm, root):
    """The modes of a file and a directory ``fs`` creates under ``root``, and of a file whose
    permission is then set to 0640."""
    Path = jvm.org.apache.hadoop.fs.Path
    out = fs.create(Path(f"file://{root}/dir/file"))
    out.write(bytearray(b"lakeslot"))
    out.close()
    fs.mkdirs(Path(f"file://{root}/made"))
    fs.setPermission(Path(f"file://{root}/dir/file"), jvm.org.apache.hadoop.fs.permission.FsPermission(0o640))
    fs.create(Path(f"file://{root}/plain")).close()
    return {name: stat.S_IMODE(os.stat(root / name).st_mode) for name in ("dir", "dir/file", "made", "plain")}


def test_the_session_writes_local_files_through_it_with_hadoops_modes(built, spark, tmp_path):
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    assert conf.get("fs.file.impl") == helpers.FS_CLASS
    ours = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}").getFileSystem(conf)
    assert ours.getClass().getName() == helpers.FS_CLASS
    stock = jvm.org.apache.hadoop.fs.LocalFileSystem()
    stock.initialize(jvm.java.net.URI("file:///"), conf)
    (tmp_path / "ours").mkdir()
    (tmp_path / "stock").mkdir()
    got, want = _modes(ours, jvm, tmp_path / "ours"), _modes(stock, jvm, tmp_path / "stock")
    assert got == want
    assert got["dir/file"] == 0o640
    # both wrote the checksum file beside the data, and the same bytes
    assert (tmp_path / "ours/dir/.file.crc").read_bytes() == (tmp_path / "stock/dir/.file.crc").read_bytes()
    assert (tmp_path / "ours/dir/file").read_bytes() == b"lakeslot"
    # the session's Iceberg tables live on it: a write and a read through Spark
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lakeslot.helpers")
    spark.sql("CREATE OR REPLACE TABLE lakeslot.helpers.t (id int) USING iceberg")
    spark.sql("INSERT INTO lakeslot.helpers.t VALUES (1), (2)")
    assert sorted(r.id for r in spark.table("lakeslot.helpers.t").collect()) == [1, 2]
    spark.sql("DROP TABLE lakeslot.helpers.t PURGE")


def test_the_row_deltas_class_is_loaded_beside_icebergs(built, spark):
    """On the driver's system class path it could not see Iceberg's classes (spark.jars)."""
    assert row_delta.available(spark._jvm)
    loader = spark._jvm.java.lang.Class.forName(helpers.ROW_DELTAS, False,
                                                spark._jvm.Thread.currentThread().getContextClassLoader())
    iceberg = spark._jvm.java.lang.Class.forName("org.apache.iceberg.Table", False, loader.getClassLoader())
    assert iceberg.getName() == "org.apache.iceberg.Table"
    assert str(built.iceberg) in spark.conf.get("spark.jars")
    assert str(built.iceberg) not in spark.conf.get("spark.driver.extraClassPath")


def _nagle(spark) -> list[bool]:
    """Whether each of py4j's connections has Nagle's algorithm on at the JVM's end."""
    jvm = spark._jvm
    field = jvm.java.lang.Class.forName("py4j.GatewayServer").getDeclaredField("connections")
    field.setAccessible(True)
    connections = field.get(spark.sparkContext._gateway.java_gateway_server).toArray()
    return [not c.getSocket().getTcpNoDelay() for c in connections]


def test_py4j_replies_are_not_held_back_on_any_threads_connection(built, spark):
    """Every Python thread talks to the JVM on a connection of its own; py4j writes a reply over
    8 KB in two writes, and with Nagle's algorithm on the JVM's end the second waited up to 40 ms
    for the Python end's delayed acknowledgement. A thread that starts after the session, and
    never made it active, gets a connection without it too."""
    before = len(_nagle(spark))
    called, release = threading.Event(), threading.Event()

    def talk() -> None:
        spark._jvm.java.lang.System.nanoTime()  # (this thread's connection opens)
        called.set()
        release.wait(60)

    thread = threading.Thread(target=talk)
    thread.start()
    try:
        assert called.wait(60)
        nagle = _nagle(spark)
        assert len(nagle) > before  # the new thread's connection is among them
        assert not any(nagle)
    finally:
        release.set()
        thread.join()


def test_without_a_jdk_sessions_keep_hadoops_file_system(monkeypatch, caplog):
    monkeypatch.setenv("PATH", "/nonexistent")
    helpers.ensure_built.cache_clear()
    try:
        with caplog.at_level("INFO", logger=helpers.__name__):
            assert helpers.ensure_built() is None
        assert "install openjdk-17-jdk-headless" in caplog.text
        assert "small batches take the MERGE" in caplog.text
    finally:
        helpers.ensure_built.cache_clear()


def _compacted(spark, iceberg_namespace: str, table: str, columns: str, more: str = "",
               properties: str = ""):
    """``table`` of ``columns``, given a row at ``lakeslot.lsn`` 41 and one at 42 (its key the
    LSN, then the values ``more``), then compacted (a replace snapshot, which carries no
    position: its parent's): the Tables of its namespace."""
    from lakeslot.spark.session import with_commit_properties
    from lakeslot.spark.tables import Tables

    catalog, namespace = iceberg_namespace.split(".", 1)
    name = f"{iceberg_namespace}.{table}"
    spark.sql(f"CREATE TABLE {name} ({columns}) USING iceberg "
              f"TBLPROPERTIES ('format-version'='2'{properties})")
    for lsn in (41, 42):
        def insert(lsn: int = lsn) -> None:
            spark.sql(f"INSERT INTO {name} VALUES ({lsn}{', ' + more if more else ''})")

        with_commit_properties(spark, {"lakeslot.lsn": str(lsn)}, insert)
    spark.sql(f"CALL {catalog}.system.rewrite_data_files(table => '{namespace}.{table}', "
              "options => map('min-input-files', '1'))")
    return Tables(spark, catalog, namespace)


def test_a_mirrors_state_read_in_one_call_is_the_one_read_call_by_call(built, spark, iceberg_namespace,
                                                                        monkeypatch):
    """TableStates: the position (through a compaction's replace snapshot, which carries none:
    its parent's), the schema with its field IDs, every property — as the calls one by one
    read them (the path without the helpers)."""
    tables = _compacted(spark, iceberg_namespace, "states",
                        "id bigint NOT NULL, `odd \"name\" é` string, tags array<int>",
                        "'v', array(1)", ", 'lakeslot.owner'='ns/x'")
    assert tables.iceberg_table("states").currentSnapshot().operation() == "replace"
    one_call = tables.load("states")
    monkeypatch.setattr(helpers, "loaded", lambda jvm, name: None)
    by_calls = tables.load("states")
    assert one_call == by_calls
    assert one_call is not None and one_call.lsn == 42 and one_call.properties["lakeslot.owner"] == "ns/x"
    assert [f.name for f in one_call.schema.fields] == ["id", 'odd "name" é', "tags"]


def test_a_snapshot_at_a_position_asked_in_one_call_is_the_one_asked_call_by_call(
        built, spark, iceberg_namespace, monkeypatch):
    """TableStates.snapshotAt (a pass's cut asks it of every member table): the current snapshot
    of the object Spark's catalog holds where it is at the position (through a compaction's
    replace snapshot: its parent's), else after one refresh, else none — question by question
    the answer of the calls one by one (the path without the helpers). Another writer's commit
    (an object of its own) is found by the refresh only."""
    tables = _compacted(spark, iceberg_namespace, "cut_member", "id bigint NOT NULL")
    held = tables.held("cut_member")
    compacted = held.currentSnapshot().snapshotId()

    def asked(position: int | None) -> int | None:
        one_call = tables.snapshot_at("cut_member", position)
        with monkeypatch.context() as m:
            m.setattr(helpers, "loaded", lambda jvm, name: None)
            assert tables.snapshot_at("cut_member", position) == one_call, position
        return one_call

    assert asked(42) == compacted  # (the replace snapshot carries none: its parent's)
    assert asked(41) is None and asked(None) is None
    jvm = spark._jvm  # another writer: an object of the table that Spark's catalog does not hold
    other = jvm.org.apache.iceberg.hadoop.HadoopTables(
        spark._jsc.hadoopConfiguration()).load(held.location())
    other.newAppend().set("lakeslot.lsn", "43").commit()
    advanced = other.currentSnapshot().snapshotId()
    assert held.currentSnapshot().snapshotId() == compacted  # (held: as it was)
    assert asked(42) == compacted  # the held object is at 42: no request
    assert asked(43) == advanced  # ... not at 43: refreshed
    assert held.currentSnapshot().snapshotId() == advanced
    assert asked(42) is None and asked(44) is None
