"""Benchmark (soak): a mirror aged to the equivalent of a day at a 1-s trigger against a fresh one,
in the same run — is a commit as fast after a day as after a minute?

    .venv/bin/python -m bench.soak [--hours 24] [--rounds 40] [--old]
                                   [--cut-tables 200,1000 [--seconds 60] [--rate 100]]

Ageing by pre-committed history (``bench/java/Soak.java``, in a JVM of its own, hadoop catalog on
local disk): the aged table is given the snapshots lakeslot's retention
(:mod:`lakeslot.mirror.contract`, "History") leaves after ``--hours`` of a busy table at a 1-s
trigger (one commit a pass; empty appends carrying ``lakeslot.lsn`` — its live files are what
compaction keeps them to, so only its history ages): one retained cut an hour, tagged for
:data:`~lakeslot.mirror.contract.RETAINED_FOR_S`, then the window of
:data:`~lakeslot.mirror.contract.RECENT_PASSES` commits and the
:data:`lakeslot.apply.upkeep.EXPIRE_MIN_S` commits a table makes between two expiries (the
worst point of the cycle). What expiry removed in between leaves no trace in the metadata, so it
is not committed (a day takes ≈ 200 commits, not 86,400). Then the smallest row delta
(:mod:`bench.commit_floor`'s) is committed to the fresh and the aged table in turn, ``--rounds``
timed after as many to warm up: each commit's time, and commit → visible (until a fresh reader's
``loadTable`` shows it: the metadata a reader parses grows with the history too). Printed: the
medians, fresh and aged, and aged ÷ fresh (the target: ≤ 1.2). With ``--old``, the same for the
retention before this one (every snapshot of 3,600 passes, expired every 450: its steady state,
reached after an hour; ≈ 4,000 commits).

With ``--cut-tables``: :mod:`bench.many_tables` rounds (``lakeslot run`` over N busy tables at a
1-s trigger, uniform writes) printing, beside commit → visible, commit → in a cut: when the cuts
record's latest cut first holds a transaction, i.e. the age of the latest cut under load.
Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path

from bench import commit_floor
from lakeslot.apply.upkeep import EXPIRE_MIN_S
from lakeslot.mirror import contract


@dataclass(frozen=True)
class Soak:
    hours: int
    snapshots: int  # the aged table's snapshots after ageing
    refs: int  # ... its refs (main and the retained cuts' tags)
    metadata_bytes: int  # ... its metadata file
    fresh_commit_s: float  # medians of the timed rounds
    fresh_visible_s: float
    aged_commit_s: float
    aged_visible_s: float


def measure(hours: int, recent: int, since_expiry: int, tag_hours: float, rounds: int) -> Soak:
    """``Soak.java``'s medians: a table aged ``hours`` under the retention given (``recent``
    commits kept, ``since_expiry`` more at the worst point of the expiry cycle, a retained cut
    an hour tagged for ``tag_hours``; 0: none), against a fresh one."""
    out = commit_floor.run_java("Soak", lambda work: [
        (Path(work) / "warehouse").as_uri(), str(hours), str(recent), str(since_expiry),
        str(tag_hours), str(rounds)])
    aged = next(line.split()[1:] for line in out.splitlines() if line.startswith("aged "))
    timed = [[int(v) / 1e9 for v in line.split()[1:]] for line in out.splitlines()
             if line.startswith("round ")]
    return Soak(hours, int(aged[0]), int(aged[1]), int(aged[2]),
                *(statistics.median(r[i] for r in timed) for i in range(4)))


def report(label: str, s: Soak) -> None:
    print(f"{label}: aged {s.hours:g} h at a 1-s trigger → {s.snapshots} snapshots, {s.refs} refs, "
          f"metadata {s.metadata_bytes / 1e6:.2f} MB")
    print(f"  commit: fresh {s.fresh_commit_s * 1000:.1f} ms, aged {s.aged_commit_s * 1000:.1f} ms "
          f"(×{s.aged_commit_s / s.fresh_commit_s:.2f}); commit → visible: fresh "
          f"{s.fresh_visible_s * 1000:.1f} ms, aged {s.aged_visible_s * 1000:.1f} ms "
          f"(×{s.aged_visible_s / s.fresh_visible_s:.2f}; target ≤ 1.2)")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--old", action="store_true",
                        help="also the retention before this one (3,600 passes of snapshots)")
    parser.add_argument("--cut-tables", default="",
                        help="comma-separated table counts for bench.many_tables rounds "
                        "(commit → in a cut under load), e.g. 200,1000")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    report("retention of lakeslot.mirror.contract", measure(
        args.hours, contract.RECENT_PASSES, int(EXPIRE_MIN_S),
        contract.RETAINED_FOR_S / 3600, args.rounds))
    if args.old:
        report("the retention before (3,600 passes)", measure(1, 3600, 450, 0, args.rounds))
    if args.cut_tables:
        from bench import many_tables

        cut = argparse.Namespace(pg="18", skew="uniform", rate=args.rate, seconds=args.seconds,
                                 table_parallelism=None, latency_ms=0.0)
        for tables in map(int, args.cut_tables.split(",")):
            many_tables.report(f"{tables} busy tables, 1-s trigger",
                               many_tables.one_round(cut, tables, 100))


if __name__ == "__main__":
    main()
