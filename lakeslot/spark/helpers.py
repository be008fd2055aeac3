"""lakeslot's Java helpers (``java/*.java``), compiled where a JDK is and put on the driver's
class path: where Python talking to Spark's JVM, or a Spark job, cost more than the work.

- ``lakeslot.hadoop.LocalFileSystem`` (:data:`FS_CLASS`, ``java/LocalFileSystem.java``): local
  disk without a process per file. Without Hadoop's native library (libhadoop: neither pip nor
  Debian ships it), Hadoop's local file system sets the permission of every file and directory
  it creates by spawning ``chmod`` — twice per file, with its checksum file (measured here: ≈ 6 ms
  a spawn, 14 spawns in a small Iceberg row delta). This is Hadoop's own ``LocalFileSystem``
  (checksum files included) over a raw layer that sets the same permission bits through
  ``java.nio``: the same files with the same modes, no processes.
- ``lakeslot.iceberg.RowDeltas`` (:data:`ROW_DELTAS`, ``java/RowDeltas.java``): the Java half of
  the driver's row delta (:mod:`lakeslot.spark.row_delta`) — a table's facts, new files'
  locations and the commit, one py4j call each instead of about forty.
- ``lakeslot.iceberg.Manifests`` (:data:`MANIFESTS`, ``java/Manifests.java``): the manifests'
  rewrite after a compaction (:mod:`lakeslot.spark.maintenance`) on the driver, not a Spark job.
- ``lakeslot.iceberg.Compactions`` (:data:`COMPACTIONS`, ``java/Compactions.java``): the commit
  of a small table's compaction on the driver (:mod:`lakeslot.spark.driver_compaction`).
- ``lakeslot.iceberg.TableStates`` (:data:`TABLE_STATES`, ``java/TableStates.java``): a mirror's
  position, schema and properties in one call (:meth:`lakeslot.spark.tables.Tables.load`).
- ``lakeslot.py4j.NoDelay`` (:data:`NO_DELAY`, ``java/NoDelay.java``): Nagle's algorithm off on
  py4j's connections, once per JVM (:func:`lakeslot.spark.session.no_delay`).

Guarantees:

- :func:`ensure_built` compiles the sources with ``javac`` against pyspark's Hadoop client and
  py4j jars and the Iceberg jars sessions load (:func:`lakeslot.spark.jars.ensure_jars`), once per
  (sources, those jars): the jar's name carries their hash, so an upgrade or an edited source
  builds anew.
  It is written under a temporary name and renamed into place when complete, under the jar
  cache's lock (:mod:`lakeslot.spark.jars`).
- They are two jars (:class:`Built`), for two class loaders. Sessions built by
  :func:`lakeslot.spark.session.build_session` put the ``system`` one (``lakeslot.hadoop``,
  ``lakeslot.py4j``) on the driver's system class path (Hadoop loads ``fs.file.impl`` from there;
  py4j's classes are there) and name :data:`FS_CLASS` in :data:`FS_IMPL`, unless their conf
  names its own ``spark.hadoop.fs.file.impl``; the Iceberg one goes with
  Iceberg's jars (``spark.jars``: a class on the system class path cannot see them). The
  container image compiles the same sources into Spark's jars (the Dockerfile's ``helpers``
  stage): Spark jobs on Kubernetes have ``RowDeltas``; their warehouse and staging are on object
  storage, where the local file system plays no part.

Failure modes: no ``javac`` (a Java runtime without the JDK) or a failed compile:
:func:`ensure_built` returns ``None`` and says why once in the log (at info level for a missing
JDK, as a warning with javac's output for a failed compile). Sessions then use Hadoop's stock
local file system (the same results, slower on local disk), small batches take the MERGE
(:func:`lakeslot.spark.row_delta.available`), a mirror's state is read call by call, and py4j's
replies keep Nagle's algorithm (slower, the same results).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple

import pyspark
from py4j.java_gateway import JavaClass

from lakeslot.spark import jars
from lakeslot.spark.jvm import java

log = logging.getLogger(__name__)

FS_CLASS = "lakeslot.hadoop.LocalFileSystem"
ROW_DELTAS = "lakeslot.iceberg.RowDeltas"
MANIFESTS = "lakeslot.iceberg.Manifests"
COMPACTIONS = "lakeslot.iceberg.Compactions"
NO_DELAY = "lakeslot.py4j.NoDelay"
TABLE_STATES = "lakeslot.iceberg.TableStates"
SOURCES = tuple(sorted((Path(__file__).parent / "java").glob("*.java")))
FS_IMPL = "spark.hadoop.fs.file.impl"
RELEASE = "11"  # the Java release the classes target (Iceberg 1.10's own)


def loaded(jvm, name: str):
    """The helper class ``name`` (:data:`ROW_DELTAS`, :data:`MANIFESTS`, :data:`COMPACTIONS`,
    :data:`TABLE_STATES`, :data:`NO_DELAY`) in ``jvm``, or None where the helpers could not be
    built (see the module docstring)."""
    found = java(jvm, name)
    return found if isinstance(found, JavaClass) else None


class Built(NamedTuple):
    """The compiled helpers: a jar per class loader (:data:`PACKAGES`: what each holds)."""

    system: Path  # the driver's system class path
    iceberg: Path  # beside Iceberg's jars


PACKAGES = {"system": ("hadoop", "py4j"), "iceberg": ("iceberg",)}  # Built's jars: lakeslot.<p>


def pyspark_jar(name: str) -> Path:
    """pyspark's jar ``name``-<version> (Hadoop's client API, py4j: classes the sources compile
    against)."""
    found = sorted((Path(pyspark.__file__).parent / "jars").glob(f"{name}-*.jar"))
    if not found:
        raise FileNotFoundError(f"no {name} jar in {Path(pyspark.__file__).parent / 'jars'}")
    return found[-1]


@functools.cache
def ensure_built() -> Built | None:
    """The compiled jars (built on first use), or ``None`` where they cannot be built (logged)."""
    javac = shutil.which("javac")
    if javac is None:
        log.info("no javac (install openjdk-17-jdk-headless): local warehouses use Hadoop's stock "
                 "file system, which spawns chmod for every file it writes, and small batches "
                 "take the MERGE instead of the driver's row delta")
        return None
    try:
        against = [pyspark_jar("hadoop-client-api"), pyspark_jar("py4j"), *jars.ensure_jars()]
        digest = hashlib.sha256(b"".join(s.name.encode() + s.read_bytes() for s in SOURCES)
                                + "\n".join(j.name for j in against).encode()).hexdigest()[:16]
        jars_dir = jars.cache_dir() / "jars"
        built = Built(*(jars_dir / f"lakeslot-{kind}-{digest}.jar" for kind in Built._fields))
        if all(jar.exists() for jar in built):
            return built
        jars_dir.mkdir(parents=True, exist_ok=True)
        with jars.locked(jars_dir / ".lock"):
            if not all(jar.exists() for jar in built):
                _build(javac, against, built)
        return built
    except (OSError, jars.JarProvisioningError) as e:
        log.warning("building lakeslot's Java helpers failed: local warehouses use Hadoop's stock "
                    "file system, small batches take the MERGE: %s", e)
        return None


def _build(javac: str, against: list[Path], built: Built) -> None:
    with tempfile.TemporaryDirectory(prefix="lakeslot-helpers-") as build:
        classes = Path(build)
        jars.run([javac, "--release", RELEASE, "-nowarn",
                         "-cp", os.pathsep.join(map(str, against)), "-d", str(classes),
                         *map(str, SOURCES)], "compiling lakeslot's Java helpers")
        for kind, jar in zip(Built._fields, built, strict=True):
            with jars.atomic_output(jar) as tmp, zipfile.ZipFile(tmp, "w") as out:
                for path in sorted(p for package in PACKAGES[kind]
                                   for p in (classes / "lakeslot" / package).rglob("*.class")):
                    out.write(path, path.relative_to(classes).as_posix())
