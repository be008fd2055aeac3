/*
 * The physical limit of a pass that changes many tables (bench/commit_floor.py): the smallest
 * row delta a pass can commit to a table — one new row in a data file, one position delete of
 * an old row in a delete file, validated from the snapshot it read, as lakeslot's RowDeltas
 * commits it — written and committed by Iceberg's own Java API and writers, with no Python, no
 * Spark and no planning, to each of N tables of a hadoop catalog on local disk, `threads` at a
 * time, in a warm JVM.
 *
 * Usage: CommitFloor <warehouse> <tables> <threads> <warm-up rounds> <timed rounds> <history>
 * Prints one line per timed round: "round <one table's commit, ns> <all tables' commits, ns>",
 * where the one table was given <history> commits (snapshots kept) before the first round.
 */

import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.Schema;
import org.apache.iceberg.Table;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.data.GenericAppenderFactory;
import org.apache.iceberg.data.GenericRecord;
import org.apache.iceberg.data.Record;
import org.apache.iceberg.deletes.PositionDelete;
import org.apache.iceberg.deletes.PositionDeleteWriter;
import org.apache.iceberg.hadoop.HadoopCatalog;
import org.apache.iceberg.io.DataWriter;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.relocated.com.google.common.util.concurrent.MoreExecutors;
import org.apache.iceberg.types.Types;

public final class CommitFloor {
  // the benchmark's tables: id int PRIMARY KEY, v int, note text, at timestamptz
  static final Schema SCHEMA =
      new Schema(
          Types.NestedField.required(1, "id", Types.IntegerType.get()),
          Types.NestedField.optional(2, "v", Types.IntegerType.get()),
          Types.NestedField.optional(3, "note", Types.StringType.get()),
          Types.NestedField.optional(4, "at", Types.TimestampType.withZone()));
  private static final int ROWS = 1000;
  // as RowDeltas: manifests scanned on the committing thread, not polled for on Iceberg's pool
  private static final ExecutorService DIRECT = MoreExecutors.newDirectExecutorService();

  private final Table table;
  private final DataFile first;  // the table's first data file, its rows deleted one per commit
  private int commits = 0;

  CommitFloor(Table table) throws Exception {
    this.table = table;
    this.first = written(0, ROWS);
    table.newAppend().appendFile(first).commit();
  }

  private DataFile written(int from, int count) throws Exception {
    OutputFileFactory files = OutputFileFactory.builderFor(table, 1, commits).format(FileFormat.PARQUET).build();
    DataWriter<Record> writer =
        new GenericAppenderFactory(SCHEMA, table.spec()).newDataWriter(files.newOutputFile(), FileFormat.PARQUET, null);
    GenericRecord row = GenericRecord.create(SCHEMA);
    try (writer) {
      for (int id = from; id < from + count; id++) {
        writer.write(row.copy(Map.of("id", id, "v", id, "note", "row " + id, "at", OffsetDateTime.now())));
      }
    }
    return writer.toDataFile();
  }

  private DeleteFile deleting(long position) throws Exception {
    OutputFileFactory files =
        OutputFileFactory.builderFor(table, 2, commits).format(FileFormat.PARQUET).suffix("deletes").build();
    PositionDeleteWriter<Record> writer =
        new GenericAppenderFactory(SCHEMA, table.spec()).newPosDeleteWriter(files.newOutputFile(), FileFormat.PARQUET, null);
    try (writer) {
      writer.write(PositionDelete.<Record>create().set(first.location(), position));
    }
    return writer.toDeleteFile();
  }

  Table table() {
    return table;
  }

  /** One row delta: row `commits` of the first file replaced by a new version of it. */
  void commit() throws Exception {
    commits += 1;
    int id = commits % ROWS;
    DataFile added = written(id, 1);
    DeleteFile deletes = deleting(id);
    table.newRowDelta().scanManifestsWith(DIRECT)
        .validateFromSnapshot(table.currentSnapshot().snapshotId())
        .validateNoConflictingDeleteFiles()
        .validateDataFilesExist(List.of(first.location()))
        .addRows(added).addDeletes(deletes)
        .set("lakeslot.lsn", String.valueOf(commits)).commit();
  }

  public static void main(String[] args) throws Exception {
    String warehouse = args[0];
    int count = Integer.parseInt(args[1]), threads = Integer.parseInt(args[2]);
    int warm = Integer.parseInt(args[3]), timed = Integer.parseInt(args[4]);
    int history = Integer.parseInt(args[5]);
    Configuration conf = new Configuration();
    String fs = System.getenv("FLOOR_FS_IMPL");  // lakeslot's local file system, as the run has
    if (fs != null) {
      conf.set("fs.file.impl", fs);
    }
    HadoopCatalog catalog = new HadoopCatalog(conf, warehouse);
    List<CommitFloor> tables = new ArrayList<>();
    for (int i = 0; i < count; i++) {
      tables.add(new CommitFloor(catalog.createTable(TableIdentifier.of("floor", "t" + i), SCHEMA,
          PartitionSpec.unpartitioned(), Map.of("format-version", "2"))));
    }
    CommitFloor one = new CommitFloor(catalog.createTable(TableIdentifier.of("floor", "one"), SCHEMA,
        PartitionSpec.unpartitioned(), Map.of("format-version", "2")));
    for (int commit = 0; commit < history; commit++) {
      one.commit();
    }
    ExecutorService pool = Executors.newFixedThreadPool(threads);
    try {
      for (int round = 0; round < warm + timed; round++) {
        long started = System.nanoTime();
        one.commit();
        long single = System.nanoTime() - started;
        started = System.nanoTime();
        List<Future<?>> commits = new ArrayList<>();
        for (CommitFloor table : tables) {
          commits.add(pool.submit(() -> { table.commit(); return null; }));
        }
        for (Future<?> commit : commits) {
          commit.get();
        }
        if (round >= warm) {
          System.out.println("round " + single + " " + (System.nanoTime() - started));
        }
      }
    } finally {
      pool.shutdown();
    }
  }
}
