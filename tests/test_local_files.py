"""The local file system local sessions use (lakeslot/spark/local_files.py): built where a JDK is,
used by the session, and writing the same files with the same modes as Hadoop's own — without a
process per file. Real Spark session (the suite's), real Hadoop file systems on local disk."""

from __future__ import annotations

import os
import shutil
import stat

import pytest

from lakeslot.spark import local_files


@pytest.fixture(scope="module")
def built():
    if shutil.which("javac") is None:
        pytest.skip("no javac here (./dev setup installs openjdk-17-jdk-headless): the stock file system is used")
    jar = local_files.ensure_jar()
    assert jar is not None and jar.is_file()
    return jar


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
    assert conf.get("fs.file.impl") == local_files.CLASS
    ours = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}").getFileSystem(conf)
    assert ours.getClass().getName() == local_files.CLASS
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
    spark.sql("CREATE NAMESPACE IF NOT EXISTS lakeslot.local_files")
    spark.sql("CREATE OR REPLACE TABLE lakeslot.local_files.t (id int) USING iceberg")
    spark.sql("INSERT INTO lakeslot.local_files.t VALUES (1), (2)")
    assert sorted(r.id for r in spark.table("lakeslot.local_files.t").collect()) == [1, 2]
    spark.sql("DROP TABLE lakeslot.local_files.t PURGE")


def test_without_a_jdk_sessions_keep_hadoops_file_system(monkeypatch, caplog):
    monkeypatch.setenv("PATH", "/nonexistent")
    local_files.ensure_jar.cache_clear()
    try:
        with caplog.at_level("INFO", logger=local_files.__name__):
            assert local_files.ensure_jar() is None
        assert "install openjdk-17-jdk-headless" in caplog.text
    finally:
        local_files.ensure_jar.cache_clear()
