"""Benchmark (soak): a mirror aged to the equivalent of a day at a 1-s trigger against a fresh one,
in the same run — is a commit as fast after a day as after a minute?

    .venv/bin/python -m bench.soak [--hours 24] [--rounds 200] [--old]
                                   [--pipeline 200 [--rows 1000]] [--seconds 60] [--rate 100]
                                   [--cut-tables 200,1000]

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
(:mod:`bench.commit_floor`'s) is committed to the fresh and the aged table in turn (which one
first alternates), ``--rounds`` timed after 60 to warm up, both histories put back to their size
after each round (untimed: the fresh table keeps one snapshot, the aged one its window): each
commit's time, and commit → visible (until a fresh reader's ``loadTable`` shows it: the metadata a
reader parses grows with the history too). Printed: the medians, fresh and aged, and aged ÷ fresh
(the target: ≤ 1.2), with the ratio in each half of the rounds (a commit takes ≈ 40 ms, and a few
milliseconds of noise move the ratio of 40 rounds by ± 0.1: the halves show what is noise).
With ``--old``, the same for the retention before this one (every snapshot of 3,600 passes,
expired every 450: its steady state, reached after an hour; ≈ 4,000 commits).

With ``--pipeline N``: the whole pipeline aged against a fresh one, same run —
:mod:`bench.many_tables` rounds (``lakeslot run`` over N busy tables of ``--rows`` rows at a 1-s
trigger, ``--rate`` uniform over them for ``--seconds``), each first caught up after its
snapshot with ``lakeslot run --once``, then, in the aged round only, every mirror aged in the
run's own Spark session as ``Soak.java`` ages its table (:func:`age_mirrors`: the same snapshots
and tags, empty appends carrying the mirror's own ``lakeslot.lsn``, one transaction per mirror),
then the measured run. Printed: both rounds, then aged ÷ fresh for commit → visible and commit →
in a cut (p50, p99), a pass's wall time and its delta step (the commits' time, threads added up).
The ageing's snapshots are all as old as the round: a table's first expiry in the run (after a
pass's worth of commits) drops the untagged ones once older than the recent window, so the
aged mirrors are fully aged in the first part of the writes and at most as aged after.
The cuts record is not aged (its snapshots are kept 600 s, its rows are trimmed to the retained
cuts': what it holds is bounded by time, not by the pipeline's age).

With ``--cut-tables``: :mod:`bench.many_tables` rounds (``lakeslot run`` over N busy tables at a
1-s trigger, uniform writes) printing, beside commit → visible, commit → in a cut: when the cuts
record's latest cut first holds a transaction, i.e. the age of the latest cut under load.
Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from bench import commit_floor, many_tables
from lakeslot.apply.upkeep import EXPIRE_MIN_S
from lakeslot.mirror import contract


@dataclass(frozen=True)
class Soak:
    hours: int
    snapshots: int  # the aged table's snapshots after ageing
    refs: int  # ... its refs (main and the retained cuts' tags)
    metadata_bytes: int  # ... its metadata file
    rounds: tuple[tuple[float, ...], ...]  # each: fresh commit, visible, aged commit, visible

    def median(self, what: int, rounds: slice = slice(None)) -> float:
        return statistics.median(r[what] for r in self.rounds[rounds])

    def ratio(self, what: int, rounds: slice = slice(None)) -> float:
        """Aged ÷ fresh of the medians of ``what`` (0: a commit, 1: commit → visible)."""
        return self.median(what + 2, rounds) / self.median(what, rounds)


def measure(hours: int, recent: int, since_expiry: int, tag_hours: float, rounds: int) -> Soak:
    """``Soak.java``'s medians: a table aged ``hours`` under the retention given (``recent``
    commits kept, ``since_expiry`` more at the worst point of the expiry cycle, a retained cut
    an hour tagged for ``tag_hours``; 0: none), against a fresh one."""
    out = commit_floor.run_java("Soak", lambda work: [
        (Path(work) / "warehouse").as_uri(), str(hours), str(recent), str(since_expiry),
        str(tag_hours), str(rounds)])
    aged = next(line.split()[1:] for line in out.splitlines() if line.startswith("aged "))
    timed = tuple(tuple(int(v) / 1e9 for v in line.split()[1:]) for line in out.splitlines()
                  if line.startswith("round "))
    return Soak(hours, int(aged[0]), int(aged[1]), int(aged[2]), timed)


def age_mirrors(hours: int, recent: int, since_expiry: int, tag_hours: float):
    """A :func:`bench.many_tables.one_round` ``prepare`` giving every mirror the history
    ``Soak.java`` gives its aged table (``hours`` retained cuts tagged for ``tag_hours``, then
    ``recent + since_expiry`` commits), as empty appends at the mirror's own position — what an
    idle advance commits — in one transaction per mirror, 16 mirrors at a time. Prints the
    mirrors' median snapshots and refs once aged."""
    from lakeslot.api.naming import IngestionNames
    from lakeslot.mirror.contract import LSN_PROPERTY, cut_tag
    from lakeslot.spark.session import on_threads
    from lakeslot.spark.tables import Tables

    def prepare(spark, local, names) -> None:
        spec = local.ingestion.spec
        tables = Tables(spark, spec.sink.catalog.name, spec.sink.namespace)
        mirrors = IngestionNames.of(local.ingestion)

        def age(name) -> tuple[int, int]:
            table = tables.iceberg_table(mirrors.mirror_table(name))
            lsn = table.currentSnapshot().summary().get(LSN_PROPERTY)
            change = table.newTransaction()
            for hour in range(hours if tag_hours > 0 else 0):  # a retained cut an hour
                change.newFastAppend().set(LSN_PROPERTY, lsn).commit()
                tag = cut_tag(int(lsn) - hours + hour)  # (distinct names below the position)
                change.manageSnapshots().createTag(
                    tag, change.table().currentSnapshot().snapshotId()).setMaxRefAgeMs(
                    tag, int(tag_hours * 3600 * 1000)).commit()
            for _ in range(recent + since_expiry):
                change.newFastAppend().set(LSN_PROPERTY, lsn).commit()
            change.commitTransaction()
            table.refresh()
            return sum(1 for _ in table.snapshots()), table.refs().size()

        started = time.monotonic()
        aged = list(on_threads(spark, 16, names, age, "bench-ageing").values())
        print(f"  aged {len(aged)} mirrors in {time.monotonic() - started:.1f} s: median "
              f"{statistics.median(a[0] for a in aged):.0f} snapshots, "
              f"{statistics.median(a[1] for a in aged):.0f} refs")

    return prepare


def report(label: str, s: Soak) -> None:
    print(f"{label}: aged {s.hours:g} h at a 1-s trigger → {s.snapshots} snapshots, {s.refs} refs, "
          f"metadata {s.metadata_bytes / 1e6:.2f} MB")
    half = len(s.rounds) // 2
    for what, name in enumerate(("commit", "commit → visible")):
        print(f"  {name}: fresh {s.median(what) * 1000:.1f} ms, aged {s.median(what + 2) * 1000:.1f}"
              f" ms (×{s.ratio(what):.2f}; target ≤ 1.2; halves ×{s.ratio(what, slice(half)):.2f},"
              f" ×{s.ratio(what, slice(half, None)):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--old", action="store_true",
                        help="also the retention before this one (3,600 passes of snapshots)")
    parser.add_argument("--cut-tables", default="",
                        help="comma-separated table counts for bench.many_tables rounds "
                        "(commit → in a cut under load), e.g. 200,1000")
    parser.add_argument("--pipeline", type=int, default=0,
                        help="tables of a whole pipeline aged against a fresh one, e.g. 200")
    parser.add_argument("--rows", type=int, default=1000, help="rows a table (--pipeline)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    if args.pipeline:
        pipeline(args)
    report("retention of lakeslot.mirror.contract", measure(
        args.hours, contract.RECENT_PASSES, int(EXPIRE_MIN_S),
        contract.RETAINED_FOR_S / 3600, args.rounds))
    if args.old:
        report("the retention before (3,600 passes)", measure(1, 3600, 450, 0, args.rounds))
    if args.cut_tables:
        for tables in map(int, args.cut_tables.split(",")):
            many_tables.report(f"{tables} busy tables, 1-s trigger",
                               many_tables.one_round(_round_options(args), tables, 100))


def _round_options(args) -> argparse.Namespace:
    """:func:`bench.many_tables.one_round`'s options for this benchmark's rounds: PostgreSQL 18,
    uniform writes at ``--rate`` for ``--seconds``, local disk."""
    return argparse.Namespace(pg="18", skew="uniform", rate=args.rate, seconds=args.seconds,
                              table_parallelism=None, latency_ms=0.0)


def pipeline(args) -> None:
    """Fresh and aged rounds of ``args.pipeline`` tables, then aged ÷ fresh."""
    options = _round_options(args)
    fresh = many_tables.one_round(options, args.pipeline, args.rows, prepare=lambda *_: None)
    many_tables.report("fresh pipeline", fresh)
    aged = many_tables.one_round(options, args.pipeline, args.rows, prepare=age_mirrors(
        args.hours, contract.RECENT_PASSES, int(EXPIRE_MIN_S), contract.RETAINED_FOR_S / 3600))
    many_tables.report(f"pipeline aged {args.hours} h", aged)

    def ratio(what: str, f: float, a: float) -> str:
        return f"{what} {f:.2f} → {a:.2f} s (×{a / f:.2f})"

    (fv, fc), (av, ac) = ((statistics.quantiles(r.latencies, n=100),
                           statistics.quantiles(r.in_cut, n=100)) for r in (fresh, aged))
    print(f"aged ÷ fresh ({args.pipeline} tables, {args.rate:g} txn/s; target ≤ 1.2): "
          + "; ".join([
              ratio("visible p50", fv[49], av[49]), ratio("visible p99", fv[98], av[98]),
              ratio("in a cut p50", fc[49], ac[49]), ratio("in a cut p99", fc[98], ac[98]),
              ratio("a pass", fresh.pass_s, aged.pass_s),
              ratio("its delta step", fresh.pass_steps.get("delta", 0.0),
                    aged.pass_steps.get("delta", 0.0))]))


if __name__ == "__main__":
    main()
