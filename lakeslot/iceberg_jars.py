"""Provision the Iceberg Spark runtime jars (Spark 3.5, Scala 2.12, Iceberg 1.10.2) into a local cache.

Guarantees:

- ``ensure_jars()`` returns absolute paths of complete jars, in classpath order, ready for
  ``spark.jars``. Every jar is written under a temporary name and renamed into place only when
  complete and checked; ``manifest.json`` is written the same way and *last*, so it is the only
  "done" marker: a run interrupted at any point leaves no manifest (or the previous one), never a
  half jar that a later run would trust.
- Warm path: when the manifest exists, names the current Iceberg version, and every jar it lists
  exists with the recorded size, the paths are returned without network, subprocesses or hashing.
- Cold path, first that works:
  1. Maven Central: the official ``org.apache.iceberg:iceberg-spark-runtime-3.5_2.12`` jar,
     checked against Maven's ``.sha1``. It is self-contained.
  2. PyPI: the same runtime jar taken from the wheel ``snowpark-connect-deps-iceberg``, which lacks
     Iceberg's relocated Jackson, plus a jar built here: Jackson 2.18.8 (from the wheel
     ``snowpark-connect-deps-2``) relocated with Debian's jarjar to
     ``org.apache.iceberg.shaded.com.fasterxml.jackson``. Both wheels are pinned by sha256 (pip
     checks them). Limitation of this route: no relocated HTTP client, so Iceberg's REST catalog
     does not work; hadoop and JDBC catalogs do.
  One log line says which route was taken and why.
- Concurrent callers serialise on a lock file in the cache; the second finds the first's result.

Failure modes: ``JarProvisioningError`` whose message says what failed and how to fix it (Maven
Central unreachable *and* the PyPI route failing: pip error, Java missing, jarjar missing and not
installable, jarjar output unreadable). A killed run may leave ``*.partial`` files or ``jars-build-*``
directories in the cache; they are never read, and the next cold run deletes them.

Cache: ``$LAKESLOT_CACHE`` if set, else ``~/.cache/lakeslot``; jars under ``<cache>/jars/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

ICEBERG_VERSION = "1.10.2"
RUNTIME_JAR = f"iceberg-spark-runtime-3.5_2.12-{ICEBERG_VERSION}.jar"
JACKSON_VERSION = "2.18.8"
RELOCATED_JACKSON_JAR = f"iceberg-relocated-jackson-{JACKSON_VERSION}.jar"
MANIFEST = "manifest.json"

MAVEN_URL = (
    "https://repo1.maven.org/maven2/org/apache/iceberg/iceberg-spark-runtime-3.5_2.12/"
    f"{ICEBERG_VERSION}/{RUNTIME_JAR}"
)
MAVEN_TIMEOUT_S = 5

# (requirement, sha256 of the wheel); PyPI files are immutable, so the hash pins the content.
ICEBERG_WHEEL = (
    "snowpark-connect-deps-iceberg==1.0.3",
    "4f280e3677ab8d3a89f16647fc392ab2a3d48369f0c48873fe07bc1e74e06ffc",
)
JACKSON_WHEEL = (
    "snowpark-connect-deps-2==3.56.7",
    "567f48506b8dd6c78083210aa6e741ba057d5a9b8ce45d58b7a12250f5ba7a5d",
)
JACKSON_MODULES = ("core", "databind", "annotations")
JARJAR_RULE = "rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1\n"
# Entries jarjar cannot process (multi-release classes, module descriptors) or that would be wrong
# after relocation (service files naming unrelocated classes, Maven metadata).
DROPPED_PREFIXES = ("META-INF/versions/", "META-INF/services/", "META-INF/maven/")
# A class Iceberg loads on its first metadata write: proof that the relocation worked.
RELOCATED_PROBE = "org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactoryBuilder.class"


class JarProvisioningError(RuntimeError):
    """The Iceberg jars could not be provided; the message says why and how to fix it."""


def cache_dir() -> Path:
    return Path(os.environ.get("LAKESLOT_CACHE") or Path.home() / ".cache" / "lakeslot").expanduser().absolute()


def ensure_jars(refresh: bool = False) -> list[Path]:
    """Return the jar paths for ``spark.jars``, provisioning them first if not cached (or if ``refresh``)."""
    jars_dir = cache_dir() / "jars"
    if not refresh and (cached := _cached(jars_dir)) is not None:
        return cached
    jars_dir.mkdir(parents=True, exist_ok=True)
    with _locked(jars_dir / ".lock"):
        if not refresh and (cached := _cached(jars_dir)) is not None:
            return cached  # another process provisioned while we waited
        return _provision(jars_dir)


def _cached(jars_dir: Path) -> list[Path] | None:
    try:
        manifest = json.loads((jars_dir / MANIFEST).read_text())
        if manifest["iceberg_version"] != ICEBERG_VERSION:
            return None
        paths = [jars_dir / jar["name"] for jar in manifest["jars"]]
        if all(p.stat().st_size == jar["size"] for p, jar in zip(paths, manifest["jars"], strict=True)):
            return paths
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_leftovers(jars_dir: Path) -> None:
    """Delete what a killed run left behind; safe because every writer holds the lock."""
    for partial in jars_dir.glob(".*.partial"):
        partial.unlink(missing_ok=True)
    for build in jars_dir.parent.glob("jars-build-*"):
        shutil.rmtree(build, ignore_errors=True)


def _provision(jars_dir: Path) -> list[Path]:
    _remove_leftovers(jars_dir)
    try:
        names = [_download_from_maven(jars_dir)]
        source, reason = "maven-central", f"downloaded from {MAVEN_URL}"
        log.info("Iceberg jars: %s", reason)
    except (OSError, http.client.HTTPException) as maven_error:
        try:
            names = _build_from_pypi(jars_dir)
        except JarProvisioningError as pypi_error:
            raise JarProvisioningError(
                f"cannot provision the Iceberg Spark runtime: Maven Central failed ({maven_error}) "
                f"and the PyPI route failed: {pypi_error}"
            ) from pypi_error
        source = "pypi-wheels"
        reason = (
            f"Maven Central not usable ({maven_error}); built from PyPI wheels {ICEBERG_WHEEL[0]} "
            f"+ {JACKSON_WHEEL[0]} (Jackson relocated with jarjar)"
        )
        log.warning("Iceberg jars: %s", reason)
    _write_manifest(jars_dir, names, source, reason)
    return [jars_dir / name for name in names]


def _write_manifest(jars_dir: Path, names: list[str], source: str, reason: str) -> None:
    manifest = {
        "iceberg_version": ICEBERG_VERSION,
        "source": source,
        "reason": reason,
        "jars": [
            {"name": n, "size": (jars_dir / n).stat().st_size, "sha256": _sha256(jars_dir / n)} for n in names
        ],
    }
    with _atomic_output(jars_dir / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextlib.contextmanager
def _atomic_output(final: Path) -> Iterator[Path]:
    """Yield a temporary path next to ``final``; rename it onto ``final`` only if the block succeeds."""
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".partial")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


# --- route 1: Maven Central ---------------------------------------------------------------------


def _download_from_maven(jars_dir: Path) -> str:
    """Download the official runtime jar. Raises OSError/HTTPException (unreachable, HTTP error, bad checksum)."""
    with urllib.request.urlopen(MAVEN_URL + ".sha1", timeout=MAVEN_TIMEOUT_S) as response:
        expected = response.read(64).decode(errors="replace").strip()[:40].lower()
    with _atomic_output(jars_dir / RUNTIME_JAR) as tmp:
        digest = hashlib.sha1()
        with urllib.request.urlopen(MAVEN_URL, timeout=MAVEN_TIMEOUT_S) as response, open(tmp, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected:
            raise OSError(f"checksum mismatch for {MAVEN_URL}: got sha1 {digest.hexdigest()}, want {expected}")
    return RUNTIME_JAR


# --- route 2: PyPI wheels + relocated Jackson ----------------------------------------------------


def _build_from_pypi(jars_dir: Path) -> list[str]:
    java = _require_java()
    jarjar = _require_jarjar()
    with tempfile.TemporaryDirectory(dir=jars_dir.parent, prefix="jars-build-") as build:
        build_dir = Path(build)
        iceberg_wheel, jackson_wheel = _pip_download(build_dir, [ICEBERG_WHEEL, JACKSON_WHEEL])
        with (
            zipfile.ZipFile(iceberg_wheel) as wheel,
            _atomic_output(jars_dir / RUNTIME_JAR) as tmp,
            wheel.open(f"snowpark_connect_deps_iceberg/jars/{RUNTIME_JAR}") as src,
            open(tmp, "wb") as out,
        ):
            shutil.copyfileobj(src, out, 1 << 20)
        merged = build_dir / "jackson-merged.jar"
        _merge_jackson(jackson_wheel, merged)
        _relocate(java, jarjar, merged, build_dir, jars_dir / RELOCATED_JACKSON_JAR)
    return [RUNTIME_JAR, RELOCATED_JACKSON_JAR]


def _require_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise JarProvisioningError("java not found on PATH: apt-get install openjdk-17-jre-headless")
    return java


def _find_jarjar() -> Path | None:
    candidates = sorted(Path("/usr/share/java").glob("jarjar*.jar"))
    return candidates[0] if candidates else None


def _require_jarjar() -> Path:
    """Debian's jarjar jar; installs ``libjarjar-java`` with apt-get when running as root."""
    if (jarjar := _find_jarjar()) is not None:
        return jarjar
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise JarProvisioningError("jarjar not found in /usr/share/java: sudo apt-get install libjarjar-java")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "libjarjar-java"],
    ):
        _run(cmd, "installing jarjar (apt-get install libjarjar-java)", env=env)
    if (jarjar := _find_jarjar()) is None:
        raise JarProvisioningError("jarjar still not found in /usr/share/java after apt-get install libjarjar-java")
    return jarjar


def _pip_download(dest: Path, wheels: list[tuple[str, str]]) -> list[Path]:
    requirements = dest / "requirements.txt"
    requirements.write_text("".join(f"{req} --hash=sha256:{sha}\n" for req, sha in wheels))
    _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
         "--quiet", "--dest", str(dest), "--requirement", str(requirements)],
        "pip download of the Iceberg/Jackson wheels (is PyPI reachable? check pip's index/proxy settings)",
    )
    found = []
    for req, _ in wheels:
        prefix = req.split("==")[0].replace("-", "_") + "-"
        matches = sorted(dest.glob(f"{prefix}*.whl"))
        if not matches:
            raise JarProvisioningError(f"pip download reported success but no wheel for {req} in {dest}")
        found.append(matches[0])
    return found


def _merge_jackson(jackson_wheel: Path, merged: Path) -> None:
    """Merge jackson-core/databind/annotations into one jar without the entries jarjar cannot handle."""
    seen: set[str] = set()
    with zipfile.ZipFile(jackson_wheel) as wheel, zipfile.ZipFile(merged, "w", zipfile.ZIP_DEFLATED) as out:
        for module in JACKSON_MODULES:
            inner = wheel.read(f"snowpark_connect_deps_2/jars/jackson-{module}-{JACKSON_VERSION}.jar")
            with zipfile.ZipFile(io.BytesIO(inner)) as jar:
                for entry in jar.infolist():
                    name = entry.filename
                    if (entry.is_dir() or name in seen or name.startswith(DROPPED_PREFIXES)
                            or name.endswith("module-info.class")):
                        continue
                    seen.add(name)
                    out.writestr(entry, jar.read(entry))


def _relocate(java: str, jarjar: Path, merged: Path, build_dir: Path, final: Path) -> None:
    rules = build_dir / "rules.txt"
    rules.write_text(JARJAR_RULE)
    with _atomic_output(final) as tmp:
        _run([java, "-jar", str(jarjar), "process", str(rules), str(merged), str(tmp)], "jarjar relocation of Jackson")
        try:
            with zipfile.ZipFile(tmp) as jar:
                ok = RELOCATED_PROBE in jar.namelist() and jar.testzip() is None
        except zipfile.BadZipFile:
            ok = False
        if not ok:
            raise JarProvisioningError(
                f"jarjar ({jarjar}) produced an unreadable jar or one without {RELOCATED_PROBE}; "
                "try reinstalling libjarjar-java"
            )


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    except OSError as e:
        raise JarProvisioningError(f"{what}: cannot run {cmd[0]}: {e}") from e
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip()[-2000:]
        raise JarProvisioningError(f"{what} failed (exit {result.returncode}): {tail}")
