"""Benchmark: the physical limit of a pass that changes many tables — the smallest row delta
committed to each of N tables by Iceberg's own Java API, with nothing of lakeslot's around it.

    .venv/bin/python -m bench.commit_floor [--tables 40] [--threads 8] [--rounds 40]
                                           [--history 0]

A pass that changes N tables makes N Iceberg commits: a table's commit is its own (a hadoop
catalog has no multi-table commit; a REST catalog's multi-table transaction still writes each
table's metadata). ``bench/java/CommitFloor.java``, compiled here with ``javac`` against the jars
lakeslot's sessions load and run in a JVM of its own, commits to each of N tables of a hadoop
catalog on local disk (lakeslot's local file system, as a run has it) the smallest row delta a
pass can make — one row written by Iceberg's Parquet writer, one position delete, validated
from the snapshot it read, as ``RowDeltas.commit`` commits it —, ``--threads`` tables at a time
(``apply.tableParallelism``), round after round; the first half of the rounds warm the JVM up.
Printed: the median over the timed rounds of one table's commit and of N tables' commits (wall
time). :mod:`bench.many_tables` runs it for its own N and prints a pass against it.

With ``--history S`` the one table is given S commits first: what its commit costs with S
snapshots kept (every commit rewrites the metadata file, which lists them all; see
:data:`lakeslot.mirror.contract.RECENT_PASSES`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyspark

from lakeslot.spark import helpers, jars

SOURCE = Path(__file__).parent / "java" / "CommitFloor.java"


@dataclass(frozen=True)
class Floor:
    tables: int
    history: int  # the one table's snapshots before the timed rounds
    one_s: float  # one table's commit, median
    many_s: float  # every table's commit, ``threads`` at a time, median


def measure(tables: int, threads: int = 8, rounds: int = 40, history: int = 0) -> Floor:
    """The medians of :data:`SOURCE`'s timed rounds (``rounds`` of them after as many to warm
    up; ``history`` commits to the one table first). Needs a JDK (``javac``)."""
    out = run_java("CommitFloor", lambda work: [
        (Path(work) / "warehouse").as_uri(), str(tables), str(threads), str(rounds), str(rounds),
        str(history)])
    timed = [line.split()[1:] for line in out.splitlines() if line.startswith("round ")]
    return Floor(tables, history, statistics.median(int(one) for one, _ in timed) / 1e9,
                 statistics.median(int(many) for _, many in timed) / 1e9)


def run_java(main: str, arguments: Callable[[str], list[str]]) -> str:
    """The output of ``main`` (a class of ``bench/java/*.java``, compiled here with ``javac``
    against the jars lakeslot's sessions load) run in a JVM of its own with ``arguments(work)``
    (``work``: a temporary directory it may write in). Needs a JDK."""
    javac = shutil.which("javac")
    if javac is None:
        raise SystemExit("the benchmark needs a JDK (javac): ./dev setup installs one")
    built = helpers.ensure_built()
    class_path = [*map(str, jars.ensure_jars()),
                  str(Path(pyspark.__file__).parent / "jars" / "*"),
                  *([str(built.system)] if built else [])]
    with tempfile.TemporaryDirectory(prefix="commit-floor-") as work:
        _run([javac, "-nowarn", "-cp", os.pathsep.join(class_path), "-d", work,
              *map(str, sorted(SOURCE.parent.glob("*.java")))])
        env = {**os.environ, **({"FLOOR_FS_IMPL": helpers.FS_CLASS} if built else {})}
        return _run(["java", "-cp", os.pathsep.join([work, *class_path]), main,
                     *arguments(work)], env)


def _run(command: list[str], env: dict[str, str] | None = None) -> str:
    """``command``'s output; its own output in the message when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"{Path(command[0]).name} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.commit_floor",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, default=40)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--history", type=int, default=0,
                        help="commits to the one table before the timed rounds")
    args = parser.parse_args()
    floor = measure(args.tables, args.threads, args.rounds, args.history)
    print(f"Iceberg's commit of the smallest row delta, warm JVM: one table "
          f"{floor.one_s:.4f} s (after {floor.history} commits to it); "
          f"{floor.tables} tables, {args.threads} at a time, {floor.many_s:.3f} s "
          f"({floor.many_s / floor.tables * 1000:.2f} ms per table)")


if __name__ == "__main__":
    main()
