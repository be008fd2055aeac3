/*
 * A mirror aged to the equivalent of <hours> at a 1-s trigger against a fresh one (bench/soak.py),
 * in one JVM. The aged table is given the snapshots lakeslot's retention leaves after those hours
 * of a busy table (one commit a pass; empty appends carrying lakeslot.lsn — its live files are
 * what compaction keeps them to, so only its history ages): one retained cut an hour, tagged
 * (kept <tag-hours>), then the window of <recent> commits and the <since-expiry> commits made
 * since the last expiry, which expires every snapshot older than the window. What expiry would
 * have removed in between leaves no trace in the metadata, so it is not committed at all (the
 * ageing takes <hours> + <recent> + <since-expiry> commits, not one a second).
 * Then rounds of the smallest row delta (CommitFloor's) to both tables, alternating, each timed
 * from the commit's start to a fresh reader's loadTable seeing it (commit → visible at the
 * Iceberg level).
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
    for (int commit = 0; commit < recent + sinceExpiry; commit++) {
      aged.newAppend().set("lakeslot.lsn", String.valueOf(++pass)).commit();
    }
    long oldest = Long.MAX_VALUE;  // the window's first commit: expiry keeps it and later ones
    int back = 0;
    for (Snapshot s = aged.currentSnapshot(); s != null && back < recent + sinceExpiry; back++) {
      oldest = s.timestampMillis();
      s = s.parentId() == null ? null : aged.snapshot(s.parentId());
    }
    aged.expireSnapshots().expireOlderThan(oldest).commit();  // (the snapshot the table was created with)
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
    for (int round = 0; round < 2 * rounds; round++) {
      long[] fresh2 = timed(freshFloor, catalog, freshId);
      long[] aged2 = timed(agedFloor, catalog, agedId);
      if (round >= rounds) {
        System.out.println("round " + fresh2[0] + " " + fresh2[1] + " " + aged2[0] + " " + aged2[1]);
      }
    }
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
