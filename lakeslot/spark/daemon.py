"""Spark's Python worker daemon (``spark.python.daemon.module``), started without the archives
of the installed pyspark package on ``sys.path``.

Spark puts ``pyspark.zip``, ``py4j-*.zip`` and its core jar on its Python workers' path, for
installations where pyspark is not a package. Each task's worker then calls
``importlib.invalidate_caches()``, and zipimport reads every archive's directory again — the
core jar's is 14 MB: measured 25 ms of the ~110 ms any Python task costs on a 2-core machine,
paid by every task of every apply pass (a pass of a caught-up source runs two or three).

Invariant: an archive is dropped only when it lies inside the pyspark package that the path
without archives imports (pip's pyspark ships its own copies there: same files, same version).
A Spark distribution's archives (``$SPARK_HOME/python/lib``) stay, as does everything else.

Failure mode: none of its own — when no such package is found, the path is left as Spark set it
and the daemon is pyspark's own.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys


def trimmed(path: list[str]) -> list[str]:
    """``path`` without the archives of the pyspark package found on it without archives."""
    archives = {p for p in path if p.endswith((".zip", ".jar"))}
    spec = importlib.machinery.PathFinder.find_spec("pyspark", [p for p in path if p not in archives])
    if spec is None or not spec.submodule_search_locations:
        return path
    homes = [os.path.join(location, "") for location in spec.submodule_search_locations]
    return [p for p in path if p not in archives or not any(p.startswith(h) for h in homes)]


def main() -> None:
    kept = trimmed(sys.path)
    for dropped in set(sys.path) - set(kept):
        sys.path_importer_cache.pop(dropped, None)  # (finding this module cached their readers)
    sys.path[:] = kept
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
