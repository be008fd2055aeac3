"""A pyarrow filesystem for a location given as a URI or a local path — one translation for
staging, the snapshot's data files and its progress document.

Invariants: a plain path is made absolute against the current directory; Hadoop's ``s3a://``
and ``s3n://`` (what Spark and Iceberg configurations carry) mean ``s3://``. Anything else is
``pyarrow.fs.FileSystem.from_uri``'s, whose errors (unknown scheme, missing credentials)
propagate unchanged. Directories exist only on a local filesystem: on an object store
:func:`create_parent` writes nothing (pyarrow would put an empty "directory marker" object, which
Iceberg's table buckets refuse: S3 Tables and SeaweedFS answer AccessDenied).
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
