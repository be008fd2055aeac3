"""A pyarrow filesystem for a location given as a URI or a local path — one translation for
staging, the snapshot's data files and its progress document.

Invariants: a plain path is made absolute against the current directory; Hadoop's ``s3a://``
and ``s3n://`` (what Spark and Iceberg configurations carry) mean ``s3://``. Anything else is
``pyarrow.fs.FileSystem.from_uri``'s, whose errors (unknown scheme, missing credentials)
propagate unchanged. Directories exist only on a local filesystem: on an object store
:func:`create_parent` writes nothing (pyarrow would put an empty "directory marker" object, which
Iceberg's table buckets refuse: S3 Tables and SeaweedFS answer AccessDenied).

:func:`explain` turns an object store's error into one naming the setting to fix (refused
credentials, a missing bucket, an unreachable endpoint); :class:`StorageError` carries it.
"""

from __future__ import annotations

import os
import re

from pyarrow import fs as pafs


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and path for a URI or local path (Hadoop's s3a/s3n are s3)."""
    uri = re.sub(r"^s3[an]://", "s3://", uri)
    if "://" not in uri and not uri.startswith("file:"):
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    return pafs.FileSystem.from_uri(uri)


def create_parent(fs: pafs.FileSystem, path: str) -> None:
    """Make the directory ``path`` will be written into, where directories exist."""
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(os.path.dirname(path), recursive=True)


class StorageError(OSError):
    """An object store refused or could not be reached; the message names the setting to fix."""


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
     "itself) in the environment of the reader and the Spark jobs"),
)


def explain(uri: str, error: BaseException, setting: str) -> str | None:
    """What ``error`` (raised while using ``uri``, configured at ``setting``) means and how to fix
    it, or None when it is not one of the object store's known refusals."""
    text = str(error)
    for pattern, meaning in _STORAGE_PROBLEMS:
        if re.search(pattern, text):
            endpoint = os.environ.get("AWS_ENDPOINT_URL")
            where = f" (now {endpoint})" if endpoint and "AWS_ENDPOINT_URL" in meaning else ""
            return f"{setting} {uri}: {meaning}{where}"
    return None
