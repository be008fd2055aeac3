"""Benchmark: the replication reader (pgoutput decoding + Parquet segments in staging) against
``pg_recvlogical -f /dev/null`` over the same changes, in the same run.

    .venv/bin/python -m bench.reader_bench [--changes 1000000] [--rounds 3] [--rss-gb 1.0]
                                           [--pg 15|18]

One run starts a throwaway PostgreSQL (``lakeslot.local.pgcluster``) and measures two things, each in
its own database (``--changes 0`` or ``--rss-gb 0`` skips one):

Throughput: a table of mixed types (≈ 135 bytes of data per row), a publication, and — before
any change — one slot per consumer run (``pg_copy_logical_replication_slot``, so every run reads
identical WAL). Then ``--changes`` row changes: half in ONE transaction (an INSERT … SELECT),
half in many small transactions of five changes each (2 inserts, 2 updates, 1 delete; a
server-side loop with a COMMIT per transaction). Each round runs both consumers one after the
other (alternating which goes first) up to the same end LSN:

- ``pg_recvlogical --start -E <end> -o proto_version=1 -o publication_names=… -f /dev/null``
- ``lakeslot reader … --stop-at-lsn <end>`` writing segments into a temporary staging directory
  (the staged change count is verified afterwards).

Per run it prints wall time, changes/s, client CPU seconds per million changes (``wait4``), the
client's peak RSS (``VmHWM``, sampled) and its walsender's CPU per million changes (sampled from
/proc while it runs); then the median rates and their ratio. The reader's rate is given twice:
over its whole process lifetime (including ≈ 0.5 s of Python start-up and imports) and over its
streaming time (from its "streaming from" log line to its exit). The target compares whole
processes.

Memory: one transaction carrying at least ``--rss-gb`` GiB of column text (rows of ≈ 1 KiB),
read once by each consumer; prints the reader's peak RSS through it and both rates.

The last line compares with the targets (≥ 1.0× pg_recvlogical's rate, < 300 MB peak RSS through
a ≥ 1 GiB transaction). Numbers, not assertions: the machine is shared and noisy; compare the
ratio from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq

from lakeslot import lsn_text
from lakeslot.local import pgcluster
from lakeslot.source.connection import PASSWORD_ENV, one_row

LAKESLOT = str(Path(sys.executable).with_name("lakeslot"))
TICKS = os.sysconf("SC_CLK_TCK")
SETTINGS = {"max_wal_size": "16GB", "checkpoint_timeout": "1h", "autovacuum": "off"}

TABLE = """
CREATE TABLE bench (id bigint PRIMARY KEY, qty int NOT NULL, amount numeric(12,2), price float8,
                    flag bool, created timestamptz, name text, note text);
CREATE PUBLICATION bench FOR TABLE bench;
"""
ROW = """{id}, {id} % 1000, ({id} % 10000000) / 100.0, {id} * 1.5, {id} % 2 = 0,
         timestamptz '2020-01-01' + {id} * interval '1 second', 'name-' || lpad(({id})::text, 15, '0'),
         md5(({id})::text)"""
SMALL_TRANSACTIONS = """
DO $$
BEGIN
  FOR i IN 0..{count} - 1 LOOP
    INSERT INTO bench SELECT {row} FROM generate_series({big} + 1 + 2 * i, {big} + 2 + 2 * i) g;
    UPDATE bench SET qty = qty + 1, note = 'updated' WHERE id IN (1 + 2 * i, 2 + 2 * i);
    DELETE FROM bench WHERE id = {big} - i;
    COMMIT;
  END LOOP;
END $$;
"""
WIDE = """
CREATE TABLE wide (id bigint PRIMARY KEY, payload text);
CREATE PUBLICATION bench FOR TABLE wide;
"""


@dataclass
class Run:
    consumer: str
    wall: float
    streaming: float
    cpu: float
    max_rss_mb: float
    walsender_cpu: float
    changes: int

    def rate(self, streaming: bool = False) -> float:
        return self.changes / (self.streaming if streaming else self.wall)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _peak_rss_mb(pid: int) -> float:
    """VmHWM of a running process (its own peak since exec; ``ru_maxrss`` would include the
    forking parent's)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _wait(process: subprocess.Popen, cluster: pgcluster.Cluster,
          slot: str) -> tuple[int, float, float, float, float]:
    """(exit code, CPU seconds, peak RSS in MB, exit time, walsender CPU seconds) of a child,
    sampling its peak RSS and its walsender's CPU every 20 ms while it runs; returns once the
    walsender is gone too."""
    peak, walsender, walsender_cpu = 0.0, None, 0.0
    with cluster.connect("postgres") as conn:
        while True:
            try:
                peak = max(peak, _peak_rss_mb(process.pid))
                if walsender is None:
                    walsender = one_row(conn.execute("SELECT active_pid FROM pg_replication_slots"
                                                     " WHERE slot_name = %s", (slot,)))[0]
                if walsender is not None:
                    walsender_cpu = _cpu_seconds(walsender)
            except (OSError, ValueError):
                pass
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                exited = time.time()
                break
            time.sleep(0.02)
        while one_row(conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                                   (slot,)))[0]:
            time.sleep(0.02)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime, peak, exited, walsender_cpu


def recvlogical(cluster, dbname: str, slot: str, end: int, changes: int) -> Run:
    dsn = f"host=127.0.0.1 port={cluster.port} dbname={dbname} user={cluster.superuser}"
    start = time.time()
    process = subprocess.Popen(
        [str(cluster.tool("pg_recvlogical")), "-d", dsn, "--slot", slot, "--start", "--no-loop",
         "-o", "proto_version=1", "-o", "publication_names=bench", "-f", "/dev/null",
         "-E", lsn_text.format(end)],
        env={**os.environ, "PGPASSWORD": cluster.password})
    code, cpu, rss, exited, walsender = _wait(process, cluster, slot)
    if code != 0:
        raise SystemExit(f"pg_recvlogical exited {code}")
    return Run("pg_recvlogical", exited - start, exited - start, cpu, rss, walsender, changes)


def lakeslot_reader(cluster, dbname: str, slot: str, end: int, changes: int) -> Run:
    with tempfile.TemporaryDirectory(prefix="lakeslot-bench-staging-") as staging, \
            tempfile.NamedTemporaryFile(prefix="lakeslot-bench-log-") as log:
        start = time.time()
        process = subprocess.Popen(
            [LAKESLOT, "reader", "--ingestion", "bench/bench", "--slot", slot,
             "--publication", "bench", "--staging", Path(staging).as_uri(),
             "--host", "127.0.0.1", "--port", str(cluster.port), "--dbname", dbname,
             "--user", cluster.superuser, "--pod", "bench", "--stop-at-lsn", lsn_text.format(end)],
            env={**os.environ, PASSWORD_ENV: cluster.password}, stderr=log)
        code, cpu, rss, exited, walsender = _wait(process, cluster, slot)
        lines = [json.loads(line) for line in Path(log.name).read_text().splitlines()]
        if code != 0:
            raise SystemExit(f"lakeslot reader exited {code}: {lines[-3:]}")
        streaming_from = next(datetime.fromisoformat(e["time"]).timestamp() for e in lines
                              if e["message"].startswith("streaming from"))
        staged = sum(
            sum(1 for op in pq.read_table(p, columns=["op"]).column("op").to_pylist()
                if op in ("I", "U", "D"))
            for p in Path(staging).glob("*.parquet"))
        if staged != changes:
            raise SystemExit(f"the reader staged {staged} changes, expected {changes}")
        return Run("lakeslot reader", exited - start, exited - max(streaming_from, start), cpu, rss,
                   walsender, changes)


def _print(run: Run) -> None:
    per_million = 1e6 / run.changes
    print(f"  {run.consumer:16s} wall {run.wall:6.2f} s  {run.rate() / 1e3:7.1f}k changes/s"
          f"  (streaming {run.streaming:6.2f} s, {run.rate(True) / 1e3:7.1f}k/s)"
          f"  client CPU {run.cpu * per_million:5.2f} s/M  walsender CPU "
          f"{run.walsender_cpu * per_million:5.2f} s/M  peak RSS {run.max_rss_mb:6.1f} MB",
          flush=True)


def throughput(cluster, dbname: str, changes: int, rounds: int) -> float:
    """Returns the median whole-process rate ratio reader / pg_recvlogical."""
    big = changes // 2
    small = (changes - big) // 5
    total = big + 5 * small
    with cluster.connect(dbname) as conn:
        conn.execute(TABLE)
        start = conn.execute("SELECT (lsn - '0/0')::int8 FROM"
                             " pg_create_logical_replication_slot('r0', 'pgoutput')").fetchone()[0]
        for name in [f"{kind}{i}" for i in range(rounds) for kind in "rp"][1:]:
            conn.execute("SELECT pg_copy_logical_replication_slot('r0', %s)", (name,))
        t = time.monotonic()
        conn.execute(f"INSERT INTO bench SELECT {ROW.format(id='g')} FROM generate_series(1, {big}) g")
        conn.execute(SMALL_TRANSACTIONS.format(count=small, big=big, row=ROW.format(id="g")))
        end = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8").fetchone()[0]
    print(f"generated {total} changes ({big} in one transaction, {5 * small} in {small} "
          f"transactions of 5) in {time.monotonic() - t:.1f} s; {(end - start) >> 20} MiB of WAL",
          flush=True)
    runs: dict[str, list[Run]] = {"pg_recvlogical": [], "lakeslot reader": []}
    for i in range(rounds):
        print(f"round {i + 1}/{rounds}", flush=True)
        order = [(recvlogical, f"p{i}"), (lakeslot_reader, f"r{i}")]
        for consume, slot in (order if i % 2 == 0 else order[::-1]):
            run = consume(cluster, dbname, slot, end, total)
            runs[run.consumer].append(run)
            _print(run)
    recv = statistics.median(r.rate() for r in runs["pg_recvlogical"])
    mine = statistics.median(r.rate(True) for r in runs["lakeslot reader"])
    whole = statistics.median(r.rate() for r in runs["lakeslot reader"])
    rss = max(r.max_rss_mb for r in runs["lakeslot reader"])
    print(f"median: pg_recvlogical {recv / 1e3:.1f}k changes/s; lakeslot reader {whole / 1e3:.1f}k"
          f" changes/s whole process ({mine / 1e3:.1f}k/s streaming); ratio {whole / recv:.2f}x"
          f" whole process, {mine / recv:.2f}x streaming; reader peak RSS {rss:.0f} MB",
          flush=True)
    return whole / recv


def rss(cluster, dbname: str, gib: float) -> float:
    """Returns the reader's peak RSS in MB through one transaction of ``gib`` GiB."""
    payload = 992  # 31 md5 hex strings: ≈ 1 KiB per row message
    rows = int(gib * (1 << 30) / payload) + 1
    with cluster.connect(dbname) as conn:
        conn.execute(WIDE)
        conn.execute("SELECT pg_create_logical_replication_slot('memory_r', 'pgoutput')")
        conn.execute("SELECT pg_copy_logical_replication_slot('memory_r', 'memory_p')")
        t = time.monotonic()
        conn.execute(f"INSERT INTO wide SELECT g, repeat(md5(g::text), 31)"
                     f" FROM generate_series(1, {rows}) g")
        end = conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::int8").fetchone()[0]
        data = conn.execute("SELECT sum(octet_length(payload) + octet_length(id::text))"
                            " FROM wide").fetchone()[0]
    print(f"generated one transaction of {rows} rows, {data / (1 << 30):.2f} GiB of column text "
          f"in {time.monotonic() - t:.1f} s", flush=True)
    recv = recvlogical(cluster, dbname, "memory_p", end, rows)
    _print(recv)
    mine = lakeslot_reader(cluster, dbname, "memory_r", end, rows)
    _print(mine)
    print(f"reader peak RSS through the {data / (1 << 30):.2f} GiB transaction: "
          f"{mine.max_rss_mb:.0f} MB; rate ratio {mine.rate() / recv.rate():.2f}x", flush=True)
    return mine.max_rss_mb


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reader_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--changes", type=int, default=1_000_000,
                        help="row changes for the throughput comparison (0: skip it)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rss-gb", type=float, default=1.0,
                        help="GiB of column text in the memory test's transaction (0: skip it)")
    parser.add_argument("--pg", choices=["15", "18"], default="15")
    args = parser.parse_args()
    install = pgcluster.debian_install(15) if args.pg == "15" else pgcluster.embedded_install()
    if install is None:
        raise SystemExit(f"PostgreSQL {args.pg} is not installed")
    verdicts = []
    with pgcluster.Cluster(install, settings=SETTINGS) as cluster:
        print(f"PostgreSQL {cluster.major} on port {cluster.port}, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)
        if args.changes:
            cluster.create_database("bench")
            ratio = throughput(cluster, "bench", args.changes, args.rounds)
            verdicts.append(f"rate {ratio:.2f}x pg_recvlogical (target >= 1.0: "
                            f"{'met' if ratio >= 1.0 else 'MISSED'})")
        if args.rss_gb:
            cluster.create_database("bench_rss")
            peak = rss(cluster, "bench_rss", args.rss_gb)
            target = "met" if peak < 300 and args.rss_gb >= 1 else "MISSED" if peak >= 300 else "n/a"
            verdicts.append(f"peak RSS {peak:.0f} MB through {args.rss_gb:g} GiB "
                            f"(target < 300 MB through >= 1 GiB: {target})")
    print("targets: " + "; ".join(verdicts))


if __name__ == "__main__":
    main()
