"""Spark's Python workers start through :mod:`lakeslot.spark.daemon`: the archives of the
installed pyspark package leave their path (a cheaper task start), a Spark distribution's and
everything else stay, and tasks run as before. Real Spark (local mode) for the last part."""

from __future__ import annotations

import sys
from pathlib import Path

from lakeslot.spark.daemon import trimmed


def _package(root: Path) -> Path:
    (root / "pyspark" / "python" / "lib").mkdir(parents=True)
    (root / "pyspark" / "jars").mkdir()
    (root / "pyspark" / "__init__.py").write_text("")
    return root / "pyspark"


def test_the_installed_packages_archives_leave_the_path_and_nothing_else(tmp_path):
    site = tmp_path / "site-packages"
    package = _package(site)
    bundled = [str(package / "python" / "lib" / "pyspark.zip"),
               str(package / "python" / "lib" / "py4j-0.10.9.7-src.zip"),
               str(package / "jars" / "spark-core_2.12-3.5.9.jar")]
    distribution = str(tmp_path / "opt" / "spark" / "python" / "lib" / "pyspark.zip")
    stdlib = str(tmp_path / "lib" / "python311.zip")
    path = [str(tmp_path / "work"), *bundled, distribution, stdlib, str(site)]
    assert trimmed(path) == [str(tmp_path / "work"), distribution, stdlib, str(site)]


def test_without_an_installed_package_the_path_stays_as_spark_set_it(tmp_path):
    path = [str(tmp_path / "opt" / "spark" / "python" / "lib" / "pyspark.zip"),
            str(tmp_path / "empty")]
    assert trimmed(path) == path


def test_the_workers_of_a_session_run_without_the_archives(spark):
    seen = spark.sparkContext.parallelize([0], 1).map(lambda _: list(sys.path)).collect()[0]
    import pyspark

    home = str(Path(pyspark.__file__).parent)
    assert not [p for p in seen if p.startswith(home) and p.endswith((".zip", ".jar"))], seen
    assert any(Path(p, "pyspark").is_dir() for p in seen)  # pyspark still importable from there
