/*
 * The Java half of the driver's row delta (lakeslot/spark/row_delta.py): what a table's small
 * batch needs of its Iceberg table, and its commit, each in one call from Python.
 *
 * Built for the same reason as LocalFileSystem.java: cost. Done from Python, a row delta was
 * about forty py4j calls (builders, metrics, locations), each one a round trip on the socket and
 * one more when Python's proxy of its result is collected; with hundreds of tables in a pass
 * that chatter was a large part of the driver's CPU on both sides. Here the table's facts, the
 * new files' locations, the commit and each file read are one call each, with JSON or bytes in
 * and out (no proxies).
 *
 * Invariants: the commit is the one row_delta.py describes (position deletes scoped to one data
 * file each, validated from the snapshot the positions were found in: a ValidationException
 * when another commit removed a file it deletes from or added deletes since); nothing is
 * committed when it throws. Metrics are Iceberg's, from each file's Parquet footer.
 *
 * Round trips (on object storage each request crosses a network): the files handed over whole
 * are written at once, with createOrOverwrite (their names are new: no existence check first),
 * while this thread reads the current snapshot's manifest list (what the commit carries over)
 * unless the snapshot has it already (manifestList, when Python read it to find positions);
 * the commit goes through CommitOperations: no reload before it or after it, its manifests and
 * manifest list uploaded at once, then the catalog's commit — three requests one after the other
 * (the files, the metadata files, the commit) where Iceberg alone makes seven or more.
 */
package lakeslot.iceberg;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.stream.Stream;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DataFiles;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.FileMetadata;
import org.apache.iceberg.HasTableOperations;
import org.apache.iceberg.io.LocationProvider;
import org.apache.iceberg.Metrics;
import org.apache.iceberg.MetricsConfig;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SnapshotUpdate;
import org.apache.iceberg.Table;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.PositionOutputStream;
import org.apache.iceberg.io.SeekableInputStream;
import org.apache.iceberg.metrics.LoggingMetricsReporter;
import org.apache.iceberg.parquet.ParquetUtil;
import org.apache.iceberg.relocated.com.google.common.util.concurrent.MoreExecutors;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.JsonNode;
import org.apache.iceberg.shaded.org.apache.parquet.format.converter.ParquetMetadataConverter;
import org.apache.iceberg.shaded.org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.iceberg.util.JsonUtil;

public final class RowDeltas {
  // Iceberg waits for its worker pool by polling every 10 ms: manifests are scanned on the
  // calling thread instead (on local disk, by Compactions and Manifests too)
  static final ExecutorService DIRECT = MoreExecutors.newDirectExecutorService();
  // a commit's files are written at once, each on a thread of its own (daemons: idle ones end;
  // the metadata files' uploads too: CommitOperations; a remote compaction's manifest reads:
  // Compactions)
  static final ExecutorService WRITERS =
      Executors.newCachedThreadPool(
          task -> {
            Thread thread = new Thread(task, "lakeslot-row-delta-writer");
            thread.setDaemon(true);
            return thread;
          });

  private RowDeltas() {}

  /**
   * The table's facts a row delta needs, as JSON: its current snapshot ("snapshot": its ID,
   * "manifest_list": its manifest list's location; both null without one), "unpartitioned",
   * and the value of each table property named in {@code properties} (a JSON list; null when
   * unset).
   */
  public static String describe(Table table, String properties) {
    Snapshot current = table.currentSnapshot();
    Map<String, String> values = table.properties();
    return JsonUtil.generate(
        gen -> {
          gen.writeStartObject();
          if (current == null) {
            gen.writeNullField("snapshot");
            gen.writeNullField("manifest_list");
          } else {
            gen.writeNumberField("snapshot", current.snapshotId());
            gen.writeStringField("manifest_list", current.manifestListLocation());
          }
          gen.writeBooleanField("unpartitioned", table.spec().isUnpartitioned());
          gen.writeObjectFieldStart("properties");
          for (String name : strings(JsonUtil.mapper().readTree(properties))) {
            gen.writeStringField(name, values.get(name));
          }
          gen.writeEndObject();
          gen.writeEndObject();
        },
        false);
  }

  /**
   * The bytes of the manifest list at {@code location}, read in one request (its size is not
   * asked first). When it is the list of {@code table}'s current snapshot, the snapshot keeps the
   * manifests it lists: a commit from that snapshot (which carries them over) does not read the
   * list again.
   */
  public static byte[] manifestList(Table table, String location) {
    FileIO io = table.io();
    byte[] content;
    try (SeekableInputStream in = io.newInputFile(location).newStream()) {
      content = in.readAllBytes();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    Snapshot current = table.currentSnapshot();
    if (current != null && location.equals(current.manifestListLocation())) {
      current.allManifests(CommitOperations.holding(io, location, content));
    }
    return content;
  }

  /**
   * The bytes of the file at {@code location} of {@code table}'s FileIO, whole, in one request,
   * or null when it holds more than {@code limit} bytes (the caller reads it in parts):
   * {@code length} is its size when the caller knows it (a manifest's or a data file's, from the
   * metadata that lists it), else negative (its size is not asked first either). One call where
   * the file's InputFile, stream, seek, read and close were six from Python, and their proxies
   * three more.
   */
  public static byte[] read(Table table, String location, long length, int limit) {
    if (length > limit) {
      return null;
    }
    FileIO io = table.io();
    try (SeekableInputStream in =
        (length < 0 ? io.newInputFile(location) : io.newInputFile(location, length)).newStream()) {
      byte[] content = in.readNBytes(limit + 1);
      return content.length > limit ? null : content;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** The locations of new data files of the given names (a JSON list), as a JSON list. */
  public static String locations(Table table, String names) {
    LocationProvider provider = table.locationProvider();
    return JsonUtil.generate(
        gen -> {
          gen.writeStartArray();
          for (String name : strings(JsonUtil.mapper().readTree(names))) {
            gen.writeString(provider.newDataLocation(name));
          }
          gen.writeEndArray();
        },
        false);
  }

  /**
   * Commit one row delta. {@code request} (JSON): "from" (the snapshot the positions were found
   * in, or null for a table without one), "property" and "value" (set in the snapshot's
   * summary), "position" (optional: the value of "property" the caller read the table at, which
   * a retry requires: CommitOperations), "files": each {"path", "size", "footer" (its Parquet
   * footer's length), "content" (true: {@code bytes} holds the whole file, written here; false:
   * only its footer, the file is written already), "referenced" (null: a data file; else a
   * position-delete file of that data file)}, their bytes following each other in {@code bytes}
   * in the files' order. Returns the table's current snapshot afterwards, as JSON: "snapshot",
   * "parent" (null: none), "sequence", "manifest_list", "summary".
   */
  public static String commit(Table table, String request, byte[] bytes) {
    JsonNode asked = JsonUtil.parse(request, node -> node);
    String property = asked.get("property").asText();
    JsonNode position = asked.get("position");
    Table known = known(table, property, position == null || position.isNull() ? null : position.asText());
    PartitionSpec spec = table.spec();
    RowDelta delta = known.newRowDelta().scanManifestsWith(DIRECT);
    if (!asked.get("from").isNull()) {
      delta = delta.validateFromSnapshot(asked.get("from").asLong()).validateNoConflictingDeleteFiles();
    }
    List<Future<?>> writes = new ArrayList<>();
    List<String> referenced = new ArrayList<>();
    int at = 0;
    for (JsonNode file : asked.get("files")) {
      String path = file.get("path").asText();
      long size = file.get("size").asLong();
      int length = file.get("footer").asInt();
      ParquetMetadata footer;
      if (file.get("content").asBoolean()) {
        int start = at;
        writes.add(WRITERS.submit(() -> write(table.io(), path, bytes, start, (int) size)));
        footer = footer(bytes, at + (int) size - 8 - length, length);
        at += (int) size;
      } else {
        footer = footer(bytes, at, length);
        at += length;
      }
      if (file.get("referenced").isNull()) {
        delta = delta.addRows(dataFile(table, path, size, footer));
      } else {
        String data = file.get("referenced").asText();
        Metrics metrics = ParquetUtil.footerMetrics(footer, Stream.empty(), MetricsConfig.forPositionDelete(table));
        delta = delta.addDeletes(FileMetadata.deleteFileBuilder(spec).ofPositionDeletes().withPath(path)
            .withFormat(FileFormat.PARQUET).withFileSizeInBytes(size).withMetrics(metrics)
            .withReferencedDataFile(data).build());
        referenced.add(data);
      }
    }
    Snapshot parent = known.currentSnapshot();
    if (parent != null) {  // (read once per Snapshot object, here or by manifestList: for the commit)
      parent.allManifests(known.io());
    }
    for (Future<?> write : writes) {
      try {
        write.get();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException("interrupted writing a row delta's files", e);
      } catch (ExecutionException e) {
        throw e.getCause() instanceof RuntimeException
            ? (RuntimeException) e.getCause()
            : new IllegalStateException(e.getCause());
      }
    }
    if (!referenced.isEmpty()) {
      delta = delta.validateDataFilesExist(referenced);
    }
    delta.set(property, asked.get("value").asText()).commit();
    Snapshot current = table.currentSnapshot();
    return JsonUtil.generate(
        gen -> {
          gen.writeStartObject();
          gen.writeNumberField("snapshot", current.snapshotId());
          if (current.parentId() == null) {
            gen.writeNullField("parent");
          } else {
            gen.writeNumberField("parent", current.parentId());
          }
          gen.writeNumberField("sequence", current.sequenceNumber());
          gen.writeStringField("manifest_list", current.manifestListLocation());
          gen.writeObjectFieldStart("summary");
          for (Map.Entry<String, String> entry : current.summary().entrySet()) {
            gen.writeStringField(entry.getKey(), entry.getValue());
          }
          gen.writeEndObject();
          gen.writeEndObject();
        },
        false);
  }

  /** Write {@code length} bytes of {@code bytes} from {@code at} as the new file {@code path}. */
  private static Void write(FileIO io, String path, byte[] bytes, int at, int length) throws IOException {
    try (PositionOutputStream out = io.newOutputFile(path).createOrOverwrite()) {
      out.write(bytes, at, length);
    }
    return null;
  }

  /**
   * {@code table} as its operations hold it now, for one commit through {@link
   * CommitOperations}: no reload before it or after it, its metadata files uploaded at once; a
   * retry only from the {@code position} (the value of the snapshot property {@code property};
   * null: any) the caller read the table at.
   */
  static Table known(Table table, String property, String position) {
    if (!(table instanceof HasTableOperations)) {
      return table;
    }
    return new BaseTable(
        new CommitOperations(((HasTableOperations) table).operations(), WRITERS, property, position), table.name(),
        table instanceof BaseTable ? ((BaseTable) table).reporter() : LoggingMetricsReporter.instance());
  }

  /** Whether {@code location} is on local disk (a path, or a file: URI). */
  static boolean local(String location) {
    return location.startsWith("/") || location.startsWith("file:");
  }

  /** The data file of {@code table} at {@code path}, Parquet, its metrics from its footer. */
  static DataFile dataFile(Table table, String path, long size, ParquetMetadata footer) {
    Metrics metrics = ParquetUtil.footerMetrics(footer, Stream.empty(), MetricsConfig.forTable(table));
    return DataFiles.builder(table.spec()).withPath(path).withFormat(FileFormat.PARQUET)
        .withFileSizeInBytes(size).withMetrics(metrics).build();
  }

  /** The Parquet footer of {@code length} bytes at {@code at} in {@code footers}. */
  static ParquetMetadata footer(byte[] footers, int at, int length) {
    try {
      return new ParquetMetadataConverter().readParquetMetadata(
          new ByteArrayInputStream(footers, at, length), ParquetMetadataConverter.NO_FILTER);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /**
   * {@code update} with each entry of {@code properties} (a JSON object of strings) set in the
   * snapshot's summary.
   */
  static <T extends SnapshotUpdate<T>> T summarized(T update, JsonNode properties) {
    T summarized = update;
    for (Map.Entry<String, JsonNode> entry : (Iterable<Map.Entry<String, JsonNode>>) properties::fields) {
      summarized = summarized.set(entry.getKey(), entry.getValue().asText());
    }
    return summarized;
  }

  static List<String> strings(JsonNode list) {
    List<String> values = new ArrayList<>();
    for (JsonNode value : list) {
      values.add(value.asText());
    }
    return values;
  }
}
