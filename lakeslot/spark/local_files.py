"""Local disk without a process per file: ``lakeslot.hadoop.LocalFileSystem`` for local sessions.

Without Hadoop's native library (libhadoop: neither pip nor Debian ships it), Hadoop's local file
system sets the permission of every file and directory it creates by spawning ``chmod`` — twice
per file, with its checksum file. Measured here (two cores): ≈ 6 ms a spawn, 14 spawns in a small
Iceberg row delta (99 ms, 49 ms without them), and every file a Spark job writes to a local
warehouse. ``lakeslot.hadoop.LocalFileSystem`` (``java/LocalFileSystem.java``) is Hadoop's own
``LocalFileSystem`` (checksum files included) over a raw layer that sets the same permission bits
through ``java.nio``: the same files with the same modes, no processes.

Guarantees:

- :func:`ensure_jar` compiles the source with ``javac`` against pyspark's own Hadoop client jar,
  once per (source, Hadoop jar) pair: the jar's name carries their hash, so an upgraded pyspark or
  an edited source builds anew. It is written under a temporary name and renamed into place when
  complete, under the jar cache's lock (:mod:`lakeslot.spark.jars`).
- Sessions built by :func:`lakeslot.spark.session.build_session` put the jar on the driver's
  system class path (Hadoop resolves ``fs.file.impl`` through it) and name :data:`CLASS` in
  :data:`FS_IMPL`, unless their conf names its own ``spark.hadoop.fs.file.impl``. Spark jobs
  submitted to Kubernetes do not (their warehouse and staging are on object storage).

Failure modes: no ``javac`` (a Java runtime without the JDK, as in the container image) or a
failed compile: :func:`ensure_jar` returns ``None`` and says why once in the log (at info level
for a missing JDK, as a warning with javac's output for a failed compile); sessions then use
Hadoop's stock local file system — the same results, slower on local disk.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import shutil
import tempfile
import zipfile
from pathlib import Path

import pyspark

from lakeslot.spark import jars as cached_jars

log = logging.getLogger(__name__)

CLASS = "lakeslot.hadoop.LocalFileSystem"
SOURCE = Path(__file__).parent / "java" / "LocalFileSystem.java"
FS_IMPL = "spark.hadoop.fs.file.impl"


def hadoop_api_jar() -> Path:
    """pyspark's Hadoop client API jar (the classes the source compiles against)."""
    found = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not found:
        raise FileNotFoundError(f"no hadoop-client-api jar in {Path(pyspark.__file__).parent / 'jars'}")
    return found[-1]


@functools.cache
def ensure_jar() -> Path | None:
    """The compiled jar (built on first use), or ``None`` where it cannot be built (logged)."""
    javac = shutil.which("javac")
    if javac is None:
        log.info("no javac (install openjdk-17-jdk-headless): local warehouses use Hadoop's stock "
                 "file system, which spawns chmod for every file it writes")
        return None
    try:
        api = hadoop_api_jar()
        digest = hashlib.sha256(SOURCE.read_bytes() + api.name.encode()).hexdigest()[:16]
        jars_dir = cached_jars.cache_dir() / "jars"
        jar = jars_dir / f"lakeslot-hadoop-{digest}.jar"
        if jar.exists():
            return jar
        jars_dir.mkdir(parents=True, exist_ok=True)
        with cached_jars.locked(jars_dir / ".lock"):
            if not jar.exists():
                _build(javac, api, jar)
        return jar
    except (OSError, cached_jars.JarProvisioningError) as e:
        log.warning("building %s failed, local warehouses use Hadoop's stock file system: %s", CLASS, e)
        return None


def _build(javac: str, api: Path, jar: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="lakeslot-hadoop-") as build:
        classes = Path(build)
        cached_jars.run([javac, "--release", "8", "-nowarn", "-cp", str(api), "-d", str(classes),
                         str(SOURCE)], f"compiling {SOURCE.name}")
        with cached_jars.atomic_output(jar) as tmp, zipfile.ZipFile(tmp, "w") as out:
            for path in sorted(classes.rglob("*.class")):
                out.write(path, path.relative_to(classes).as_posix())
