/*
 * A mirror aged to the equivalent of <hours> at a 1-s trigger against a fresh one (bench/soak.py),
 * in one JVM. The aged table is given the snapshots lakeslot's retention leaves after those hours
 * of a busy table (one commit a pass; empty appends carrying lakeslot.lsn — its live files are
 * what compaction keeps them to, so only its history ages): one retained cut an hour, tagged
 * (kept <tag-hours>), then the window of <recent> commits and the <since-expiry> commits made
 * since the last expiry, which expires every snapshot older than the window. What expiry would
 * have removed in between leaves no trace in the metadata, so it is not committed at all (the
 * ageing takes <hours> + <recent> + <since-expiry> commits, not one a second).
 * Then rounds of the smallest row delta (CommitFloor's) to both tables, each timed from the
 * commit's start to a fresh reader's loadTable seeing it (commit → visible at the Iceberg level).
 * Which table commits first alternates from round to round, and after each round (untimed) both
 * histories are put back to their size: the fresh table keeps its current snapshot only, the aged
 * one drops the snapshot that left its window, as lakeslot's expiry would — so the last round
 * measures the same histories as the first (both tables' metadata logs are full after the
 * warm-up's rounds, as a mirror's is after 100 passes). WARMUP rounds run before the timed ones.
 *
 * Usage: Soak <warehouse> <hours> <recent> <since-expiry> <tag-hours> <rounds>
 * (<tag-hours> 0: no retained cuts, no tags.)
 * Prints "aged <snapshots> <refs> <metadata bytes>" then per timed round
 * "round <fresh commit ns> <fresh visible ns> <aged commit ns> <aged visible ns>".
 */

import java.util.Map;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.hadoop.HadoopCatalog;
import org.apache.iceberg.hadoop.HadoopTableOperations;

public final class Soak {
  public static void main(String[] args) throws Exception {
    String warehouse = args[0];
    int hours = Integer.parseInt(args[1]), recent = Integer.parseInt(args[2]);
    int sinceExpiry = Integer.parseInt(args[3]);
    double tagHours = Double.parseDouble(args[4]);
    int rounds = Integer.parseInt(args[5]);
    Configuration conf = new Configuration();
    String fs = System.getenv("FLOOR_FS_IMPL");
    if (fs != null) {
      conf.set("fs.file.impl", fs);
    }
    HadoopCatalog catalog = new HadoopCatalog(conf, warehouse);
    Map<String, String> props = Map.of("format-version", "2",
        "write.metadata.delete-after-commit.enabled", "true",
        "write.metadata.previous-versions-max", "100");
    TableIdentifier agedId = TableIdentifier.of("soak", "aged");
    TableIdentifier freshId = TableIdentifier.of("soak", "fresh");
    Table aged = catalog.createTable(agedId, CommitFloor.SCHEMA, PartitionSpec.unpartitioned(), props);
    long pass = 0;
    for (int hour = 0; tagHours > 0 && hour < hours; hour++) {  // a retained cut an hour
      pass += 3600;
      aged.newAppend().set("lakeslot.lsn", String.valueOf(pass)).commit();
      String tag = "lakeslot-cut-" + pass;
      aged.manageSnapshots().createTag(tag, aged.currentSnapshot().snapshotId())
          .setMaxRefAgeMs(tag, (long) (tagHours * 3600 * 1000)).commit();
    }
    int window = recent + sinceExpiry;
    for (int commit = 0; commit < window; commit++) {
      aged.newAppend().set("lakeslot.lsn", String.valueOf(++pass)).commit();
    }
    aged.expireSnapshots().expireOlderThan(windowStart(aged, window)).commit();  // (the table's first)
    CommitFloor agedFloor = new CommitFloor(aged);
    Table fresh = catalog.createTable(freshId, CommitFloor.SCHEMA, PartitionSpec.unpartitioned(), props);
    CommitFloor freshFloor = new CommitFloor(fresh);
    aged.refresh();
    int snapshots = 0;
    for (Snapshot ignored : aged.snapshots()) {
      snapshots++;
    }
    String location = ((HadoopTableOperations) ((org.apache.iceberg.HasTableOperations) aged).operations())
        .current().metadataFileLocation();
    long bytes = aged.io().newInputFile(location).getLength();
    System.out.println("aged " + snapshots + " " + aged.refs().size() + " " + bytes);
    for (int round = 0; round < WARMUP + rounds; round++) {
      long[] fresh2, aged2;
      if (round % 2 == 0) {
        fresh2 = timed(freshFloor, catalog, freshId);
        aged2 = timed(agedFloor, catalog, agedId);
      } else {
        aged2 = timed(agedFloor, catalog, agedId);
        fresh2 = timed(freshFloor, catalog, freshId);
      }
      fresh.expireSnapshots().expireOlderThan(windowStart(fresh, 1)).commit();
      aged.expireSnapshots().expireOlderThan(windowStart(aged, window + 1)).commit();  // (+ its data's)
      if (round >= WARMUP) {
        System.out.println("round " + fresh2[0] + " " + fresh2[1] + " " + aged2[0] + " " + aged2[1]);
      }
    }
  }

  private static final int WARMUP = 60;

  /** When the oldest of the last `window` commits on main was made (expiry keeps it and later). */
  private static long windowStart(Table table, int window) {
    Snapshot s = table.currentSnapshot();
    for (int back = 1; back < window && s.parentId() != null; back++) {
      s = table.snapshot(s.parentId());
    }
    return s.timestampMillis();
  }

  /** One row delta: its commit's time, and the time until a fresh reader sees it. */
  private static long[] timed(CommitFloor floor, HadoopCatalog catalog, TableIdentifier id)
      throws Exception {
    long started = System.nanoTime();
    floor.commit();
    long committed = System.nanoTime() - started;
    long expected = floor.table().currentSnapshot().snapshotId();
    while (catalog.loadTable(id).currentSnapshot().snapshotId() != expected) {
      Thread.onSpinWait();
    }
    return new long[] {committed, System.nanoTime() - started};
  }
}
