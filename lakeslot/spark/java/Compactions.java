/*
 * The commit of a small table's compaction on the driver (lakeslot/spark/driver_compaction.py):
 * every file of one snapshot replaced by the one data file Python wrote from its live rows, as
 * one RewriteFiles, in one call.
 *
 * Invariants: the files replaced are those of the snapshot the rows were read from, listed here
 * from its manifests and checked against the data files Python read (a ValidationException when
 * they differ: nothing is committed); every delete file of that snapshot is replaced with them
 * (they delete from those data files only), and a delete file that is not a position delete
 * fails the call. The commit is validated from that snapshot: another commit since that removed
 * one of the files or added deletes to one fails Iceberg's validation. One commit or none.
 *
 * Round trips: where the table's files are not on local disk, its manifests are read at once
 * (here, and by the commit, which writes the rewritten ones), not one after the other — a small
 * table compacted after a few passes has tens of them: ≈ 2 s in a row at 30 ms a request — and
 * the commit goes through CommitOperations as a row delta's does (no reload before or after it,
 * its new manifests uploaded as they close). On local disk they are read on the calling thread
 * (Iceberg's pool is polled every 10 ms).
 */
package lakeslot.iceberg;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Future;
import org.apache.iceberg.ContentFile;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileContent;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestReader;
import org.apache.iceberg.RewriteFiles;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.exceptions.ValidationException;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.relocated.com.google.common.base.Preconditions;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.JsonNode;
import org.apache.iceberg.util.JsonUtil;

public final class Compactions {
  private Compactions() {}

  /**
   * Replace every file of the unpartitioned {@code table}'s snapshot "from" with "file" (null:
   * with nothing, the snapshot held no live row). {@code request} (JSON): "from", "data" (the
   * paths of the data files the rows were read from), "file" ({"path", "size"}, its Parquet
   * footer being {@code footer}) and "properties" (set in the snapshot's summary). Returns, as
   * JSON: "data" and "deletes" (how many data and delete files were replaced), and the new
   * snapshot's "sequence" and "manifest_list".
   */
  public static String rewrite(Table table, String request, byte[] footer) {
    JsonNode asked = JsonUtil.parse(request, node -> node);
    Preconditions.checkArgument(table.spec().isUnpartitioned(), "%s is partitioned", table.name());
    long from = asked.get("from").asLong();
    Snapshot snapshot = table.snapshot(from);
    ValidationException.check(snapshot != null, "snapshot %s of %s is gone", from, table.name());
    FileIO io = table.io();
    Set<String> read = new HashSet<>(RowDeltas.strings(asked.get("data")));
    boolean remote = !RowDeltas.local(table.location());
    ExecutorService manifests = remote ? RowDeltas.WRITERS : RowDeltas.DIRECT;
    Table committing = remote ? RowDeltas.known(table, null, null) : table;
    RewriteFiles rewrite = committing.newRewrite().validateFromSnapshot(from).scanManifestsWith(manifests);
    List<Future<List<DataFile>>> dataFiles = new ArrayList<>();
    for (ManifestFile manifest : snapshot.dataManifests(io)) {
      dataFiles.add(listed(manifests, () -> ManifestFiles.read(manifest, io, table.specs())));
    }
    List<Future<List<DeleteFile>>> deleteFiles = new ArrayList<>();
    for (ManifestFile manifest : snapshot.deleteManifests(io)) {
      deleteFiles.add(listed(manifests, () -> ManifestFiles.readDeleteManifest(manifest, io, table.specs())));
    }
    int data = 0;
    for (Future<List<DataFile>> reading : dataFiles) {
      for (DataFile file : done(reading)) {
        ValidationException.check(read.remove(file.location()), "data file %s was not read", file.location());
        rewrite = rewrite.deleteFile(file);
        data++;
      }
    }
    ValidationException.check(read.isEmpty(), "data files %s are not in snapshot %s", read, from);
    int deletes = 0;
    for (Future<List<DeleteFile>> reading : deleteFiles) {
      for (DeleteFile file : done(reading)) {
        ValidationException.check(file.content() == FileContent.POSITION_DELETES,
            "%s holds %s", file.location(), file.content());
        rewrite = rewrite.deleteFile(file);
        deletes++;
      }
    }
    JsonNode file = asked.get("file");
    if (!file.isNull()) {
      rewrite = rewrite.addFile(RowDeltas.dataFile(table, file.get("path").asText(),
          file.get("size").asLong(), RowDeltas.footer(footer, 0, footer.length)));
    }
    RowDeltas.summarized(rewrite, asked.get("properties")).commit();
    Snapshot current = table.currentSnapshot();  // (CommitOperations holds the table's own)
    int replacedData = data;
    int replacedDeletes = deletes;
    return JsonUtil.generate(
        gen -> {
          gen.writeStartObject();
          gen.writeNumberField("data", replacedData);
          gen.writeNumberField("deletes", replacedDeletes);
          gen.writeNumberField("sequence", current.sequenceNumber());
          gen.writeStringField("manifest_list", current.manifestListLocation());
          gen.writeEndObject();
        },
        false);
  }

  /** The files of the manifest {@code open} opens, read on {@code pool}. */
  private static <F extends ContentFile<F>> Future<List<F>> listed(
      ExecutorService pool, Callable<ManifestReader<F>> open) {
    return pool.submit(() -> {
      List<F> files = new ArrayList<>();
      try (ManifestReader<F> reader = open.call()) {
        reader.forEach(file -> files.add(file.copy()));
      }
      return files;
    });
  }

  /** A manifest's files, read on the pool (its error rethrown as it was). */
  private static <T> List<T> done(Future<List<T>> listed) {
    try {
      return listed.get();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted reading a manifest", e);
    } catch (ExecutionException e) {
      if (e.getCause() instanceof IOException) {
        throw new UncheckedIOException((IOException) e.getCause());
      }
      throw e.getCause() instanceof RuntimeException
          ? (RuntimeException) e.getCause()
          : new IllegalStateException(e.getCause());
    }
  }
}
