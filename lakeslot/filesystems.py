"""A pyarrow filesystem for a location given as a URI or a local path — one translation for
staging, the snapshot's data files and its progress document.

Invariants: a plain path is made absolute against the current directory; Hadoop's ``s3a://``
and ``s3n://`` (what Spark and Iceberg configurations carry) mean ``s3://``. Anything else is
``pyarrow.fs.FileSystem.from_uri``'s, whose errors (unknown scheme, missing credentials)
propagate unchanged. Directories exist only on a local filesystem: on an object store
:func:`create_parent` writes nothing (pyarrow would put an empty "directory marker" object, which
Iceberg's table buckets refuse: S3 Tables and SeaweedFS answer AccessDenied).

Whose credentials: a process that runs *for* one ingestion (the reader, the Spark jobs, the
verification Job, ``lakeslot run``) has that ingestion's ``spec.secretEnv`` as its environment and
opens storage with it (``environ`` None: the AWS SDK's own chain). The operator serves many
ingestions in one process whose environment holds none of their keys: it passes each
ingestion's resolved ``secretEnv`` as ``environ`` (:class:`S3Access`), and an ``s3://`` location
is then opened with exactly those settings — endpoint, region, keys, session token — never with
the process's environment variables. Where ``environ`` sets no keys, the SDK's chain supplies
them: workload identity on the operator's own service account (IRSA, EKS Pod Identity). Other
schemes (``gs://``, ``abfs://``, ``hdfs://``) are opened with the process's own identity.

:func:`explain` turns an object store's error into one naming the setting to fix (refused
credentials, a missing bucket, an unreachable endpoint); :class:`StorageError` carries it.
:func:`write_document` and :func:`read_document` keep a small JSON document (a status, a
progress record, a verification result) that is replaced whole: a reader sees the previous
document or the next, never a mix (a torn read on an object store is read again).
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
import urllib.parse
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from pyarrow import fs as pafs

# An S3 file written is one PUT when it is small (below 5 MB), not a multipart upload begun when
# it opens (three requests one after the other: begin, the part, complete — a sealed segment, a
# status document): pyarrow's ``allow_delayed_open``. What it costs: a missing bucket or refused
# keys are told when the file is closed instead of opened; every write here checks its close.
DELAYED_OPEN = True


def filesystem(uri: str, environ: Mapping[str, str] | None = None) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and path for a URI or local path (Hadoop's s3a/s3n are s3);
    ``environ``: the ingestion's storage settings (see the module docstring), None: this
    process's."""
    uri = re.sub(r"^s3[an]://", "s3://", uri)
    if "://" not in uri and not uri.startswith("file:"):
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if environ is not None and uri.startswith("s3://"):
        bucket_and_key = uri.removeprefix("s3://")
        return S3Access.of(environ).filesystem(bucket_and_key.split("/", 1)[0]), bucket_and_key
    if uri.startswith("s3://") and "allow_delayed_open" not in uri:
        uri += f"{'&' if '?' in uri else '?'}allow_delayed_open={str(DELAYED_OPEN).lower()}"
    return pafs.FileSystem.from_uri(uri)



@dataclass(frozen=True)
class S3Access:
    """What the AWS SDKs read from their environment to reach S3, as one ingestion's
    ``secretEnv`` gives it (None: not set there)."""

    access_key: str | None = None
    secret_key: str | None = None
    session_token: str | None = None
    region: str | None = None
    endpoint: str | None = None  # a URL (``https://host[:port]``), for a store other than AWS

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> S3Access:
        def get(*names: str) -> str | None:
            return next((environ[n] for n in names if environ.get(n)), None)

        access = cls(get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY"), get("AWS_SESSION_TOKEN"),
                     get("AWS_REGION", "AWS_DEFAULT_REGION"), get("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
        if (access.access_key is None) != (access.secret_key is None):
            raise StorageError("spec.secretEnv sets one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                               "without the other: set both (or neither, for workload identity)")
        return access

    def filesystem(self, bucket: str) -> pafs.S3FileSystem:
        """An S3 filesystem with these settings alone (keys left out: the SDK's chain)."""
        options: dict[str, object] = {"access_key": self.access_key, "secret_key": self.secret_key,
                                      "session_token": self.session_token}
        if self.endpoint is not None:
            parts = urllib.parse.urlsplit(self.endpoint if "://" in self.endpoint else f"https://{self.endpoint}")
            options.update(endpoint_override=parts.netloc, scheme=parts.scheme)
        options["region"] = self.region or ("us-east-1" if self.endpoint else _bucket_region(bucket))
        return pafs.S3FileSystem(**options, allow_delayed_open=DELAYED_OPEN)


@functools.lru_cache(maxsize=256)
def _bucket_region(bucket: str) -> str:
    """An AWS bucket's region (one request per bucket and process; us-east-1 if it cannot be
    told: the request then fails with the store's own message)."""
    try:
        return pafs.resolve_s3_region(bucket)
    except OSError:
        return "us-east-1"


def create_parent(fs: pafs.FileSystem, path: str) -> None:
    """Make the directory ``path`` will be written into, where directories exist."""
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(os.path.dirname(path), recursive=True)


class StorageError(OSError):
    """An object store refused or could not be reached; the message names the setting to fix."""


DOCUMENT_READS = 5  # a document that does not parse is read again (a torn read), this often


def write_document(fs: pafs.FileSystem, path: str, document: dict) -> None:
    """Replace the JSON document at ``path`` whole: written beside it and renamed into place on
    a local filesystem, one PUT (atomic) on an object store."""
    data = json.dumps(document, indent=1).encode()
    if not isinstance(fs, pafs.LocalFileSystem):
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    create_parent(fs, path)
    directory, _, name = path.rpartition("/")
    temp = f"{directory}/.{name}-{uuid.uuid4().hex[:8]}.tmp"
    with fs.open_output_stream(temp) as f:
        f.write(data)
    fs.move(temp, path)


def read_document(fs: pafs.FileSystem, path: str) -> dict | None:
    """The JSON document at ``path`` (:func:`write_document`), or None when there is none.

    A read that races the PUT replacing the document on an object store can come back torn
    (seen on SeaweedFS through pyarrow, which sizes its read by a HEAD before the GET: a whole
    document followed by other bytes), so a document that does not parse is read again; one
    that never parses is a :class:`StorageError` naming it."""
    error: ValueError | None = None
    for attempt in range(DOCUMENT_READS):
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with fs.open_input_stream(path) as f:
            data = f.read()
        try:
            return json.loads(data)
        except ValueError as e:
            error = e
            time.sleep(0.05 * (attempt + 1))
    raise StorageError(f"{path} is not a JSON document after {DOCUMENT_READS} reads ({error}): "
                       "was it written by something other than lakeslot?")


# (pattern in pyarrow's message, what it means and what to fix) — S3 through pyarrow's AWS SDK
_STORAGE_PROBLEMS = (
    (r"SIGNATURE_DOES_NOT_MATCH|INVALID_ACCESS_KEY_ID|InvalidAccessKeyId|SignatureDoesNotMatch|ACCESS_DENIED"
     r"|AccessDenied",
     "the object store refused the credentials or denied access: fix AWS_ACCESS_KEY_ID and "
     "AWS_SECRET_ACCESS_KEY (spec.secretEnv) or the service account's workload identity, and grant "
     "it read and write on this location"),
    (r"Bucket '([^']+)' not found|NoSuchBucket|NO_SUCH_BUCKET",
     "the bucket does not exist: create it, or fix the bucket in the URI"),
    (r"NETWORK_CONNECTION|curlCode: (6|7|28)|Could not connect|Connection refused",
     "the object store's endpoint cannot be reached: fix AWS_ENDPOINT_URL (or AWS_REGION for AWS "
     "itself) in spec.secretEnv (the environment of the reader and the jobs, and what the operator "
     "reaches staging and the warehouse with)"),
)


def explain(uri: str, error: BaseException, setting: str,
            environ: Mapping[str, str] | None = None) -> str | None:
    """What ``error`` (raised while using ``uri``, configured at ``setting``, with the settings
    ``environ``: None, this process's) means and how to fix it, or None when it is not one of the
    object store's known refusals."""
    text = str(error)
    for pattern, meaning in _STORAGE_PROBLEMS:
        if re.search(pattern, text):
            endpoint = (os.environ if environ is None else environ).get("AWS_ENDPOINT_URL")
            where = f" (now {endpoint})" if endpoint and "AWS_ENDPOINT_URL" in meaning else ""
            return f"{setting} {uri}: {meaning}{where}"
    return None
