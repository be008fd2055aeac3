/*
 * A table's operations for one commit of the driver's row delta (RowDeltas.java), cut to the
 * round trips the commit needs where each request crosses a network (object storage, a REST
 * catalog).
 *
 * Invariants:
 * - No reload before the commit: Iceberg refreshes before each attempt; here the first attempt
 *   starts from the state the caller's table holds (loaded this pass, or its last commit's
 *   answer). The catalog checks the commit's requirements against the table (a REST catalog's
 *   assert-ref-snapshot-id, a JDBC or hadoop catalog's metadata location): an attempt from a
 *   state that is no longer the table's fails with CommitFailedException, and from then on each
 *   refresh reloads (Iceberg's retry starts from the table as it is, and validates the row
 *   delta against the snapshots in between as always).
 * - No reload after it: the commit's answer carries the new metadata, which the operations hold.
 * - A retry never applies a change to a table that moved: with the position the caller read the
 *   table at (its "lakeslot.lsn", the property named), the reload after a refused attempt must
 *   find the table still there, or the commit fails with Moved before anything is retried —
 *   another job committed to the table (a re-snapshot), and the change was planned from a
 *   position that is no longer the table's. (A compaction keeps the position: the retry goes on,
 *   and Iceberg's validation decides as always.)
 * - The commit's metadata files (its manifests, its manifest list: new names, Avro) are not on
 *   the commit's path one after the other: each is uploaded when its writer closes, on a thread
 *   of its own, and the catalog's commit waits for every upload first — a commit never names a
 *   file that is not in storage; an upload that failed fails the attempt before the catalog is
 *   asked (Iceberg deletes what the attempt wrote, as for any failed attempt). A read of one of
 *   them is served from the bytes written (after the commit Iceberg reads the new manifest list
 *   back: no request); a delete waits for its upload. Files on local disk are written in place.
 *
 * Failure modes: the delegate's own (storage or catalog errors, CommitFailedException,
 * CommitStateUnknownException), unchanged; Moved (above), nothing committed.
 */
package lakeslot.iceberg;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.TableOperations;
import org.apache.iceberg.encryption.EncryptionManager;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.LocationProvider;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.io.PositionOutputStream;
import org.apache.iceberg.io.SeekableInputStream;

final class CommitOperations implements TableOperations {
  private final TableOperations ops;
  private final Uploads io;
  private final String property;
  private final String position;
  private volatile boolean stale = false;

  /**
   * {@code ops} for one commit; {@code position}: the value of the snapshot property {@code
   * property} the table had when the caller read it (null: not checked).
   */
  CommitOperations(TableOperations ops, ExecutorService uploads, String property, String position) {
    this.ops = ops;
    this.io = new Uploads(ops.io(), uploads);
    this.property = property;
    this.position = position;
  }

  /**
   * {@code io} with the file at {@code path} served from {@code content}, its bytes read
   * already: a snapshot that lists its manifests through it asks storage for nothing.
   */
  static FileIO holding(FileIO io, String path, byte[] content) {
    Uploads files = new Uploads(io, RowDeltas.DIRECT);
    files.held.put(path, content);
    return files;
  }

  @Override
  public TableMetadata current() {
    return ops.current();
  }

  @Override
  public TableMetadata refresh() {
    if (!stale) {
      return ops.current();
    }
    TableMetadata fresh = ops.refresh();
    if (position != null) {
      String now = position(fresh, property);
      if (!position.equals(now)) {
        throw new Moved(position, now);
      }
    }
    return fresh;
  }

  /**
   * The value of {@code property} in the current snapshot's summary of {@code metadata}; a
   * "replace" snapshot without it (a compaction) has its parent's. Null without either.
   */
  static String position(TableMetadata metadata, String property) {
    Snapshot snapshot = metadata.currentSnapshot();
    while (snapshot != null && snapshot.summary().get(property) == null
        && "replace".equals(snapshot.operation()) && snapshot.parentId() != null) {
      snapshot = metadata.snapshot(snapshot.parentId());
    }
    return snapshot == null ? null : snapshot.summary().get(property);
  }

  /** The table's position is no longer the one the commit was planned from: nothing committed. */
  public static final class Moved extends RuntimeException {
    Moved(String from, String to) {
      super("the table moved from position " + from + " to " + to
          + " since it was read (another job committed to it)");
    }
  }

  @Override
  public void commit(TableMetadata base, TableMetadata metadata) {
    io.awaitAll();
    try {
      ops.commit(base, metadata);
    } catch (CommitFailedException e) {
      stale = true;
      throw e;
    }
  }

  @Override
  public FileIO io() {
    return io;
  }

  @Override
  public EncryptionManager encryption() {
    return ops.encryption();
  }

  @Override
  public String metadataFileLocation(String fileName) {
    return ops.metadataFileLocation(fileName);
  }

  @Override
  public LocationProvider locationProvider() {
    return ops.locationProvider();
  }

  @Override
  public TableOperations temp(TableMetadata uncommittedMetadata) {
    return ops.temp(uncommittedMetadata);
  }

  @Override
  public long newSnapshotId() {
    return ops.newSnapshotId();
  }

  @Override
  public boolean requireStrictCleanup() {
    return ops.requireStrictCleanup();
  }

  /** The table's FileIO, its new Avro files elsewhere than on local disk uploaded on close. */
  static final class Uploads implements FileIO {
    private final FileIO io;
    private final ExecutorService pool;
    private final Map<String, CompletableFuture<Void>> pending = new ConcurrentHashMap<>();
    private final Map<String, byte[]> held = new ConcurrentHashMap<>();  // path → bytes

    Uploads(FileIO io, ExecutorService pool) {
      this.io = io;
      this.pool = pool;
    }

    /** Wait for every upload begun; the first failure is thrown. */
    void awaitAll() {
      for (String path : pending.keySet()) {
        await(path);
      }
    }

    private void await(String path) {
      CompletableFuture<Void> upload = pending.get(path);
      if (upload == null) {
        return;
      }
      try {
        upload.join();
      } catch (java.util.concurrent.CompletionException e) {
        throw e.getCause() instanceof RuntimeException
            ? (RuntimeException) e.getCause()
            : new IllegalStateException(e.getCause());
      }
    }

    @Override
    public InputFile newInputFile(String path) {
      byte[] content = held.get(path);
      return content != null ? new Held(path, content) : io.newInputFile(path);
    }

    @Override
    public InputFile newInputFile(String path, long length) {
      byte[] content = held.get(path);
      return content != null ? new Held(path, content) : io.newInputFile(path, length);
    }

    @Override
    public OutputFile newOutputFile(String path) {
      OutputFile file = io.newOutputFile(path);
      return path.endsWith(".avro") && !RowDeltas.local(path) ? new Deferred(file) : file;
    }

    @Override
    public void deleteFile(String path) {
      try {
        await(path);
      } catch (RuntimeException e) {
        // (its upload failed: delete whatever part of it there may be all the same)
      }
      io.deleteFile(path);
    }

    @Override
    public Map<String, String> properties() {
      return io.properties();
    }

    /** A new file whose bytes are uploaded when its stream closes (without waiting). */
    private final class Deferred implements OutputFile {
      private final OutputFile file;

      Deferred(OutputFile file) {
        this.file = file;
      }

      @Override
      public PositionOutputStream create() {
        return createOrOverwrite();  // (a new name: no existence check, a round trip)
      }

      @Override
      public PositionOutputStream createOrOverwrite() {
        return new PositionOutputStream() {
          private final ByteArrayOutputStream bytes = new ByteArrayOutputStream();
          private boolean closed = false;

          @Override
          public long getPos() {
            return bytes.size();
          }

          @Override
          public void write(int b) {
            bytes.write(b);
          }

          @Override
          public void write(byte[] b, int off, int len) {
            bytes.write(b, off, len);
          }

          @Override
          public void close() {
            if (closed) {
              return;
            }
            closed = true;
            byte[] content = bytes.toByteArray();
            held.put(file.location(), content);
            pending.put(file.location(), CompletableFuture.runAsync(() -> upload(content), pool));
          }
        };
      }

      private void upload(byte[] content) {
        try (PositionOutputStream out = file.createOrOverwrite()) {
          out.write(content);
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      }

      @Override
      public String location() {
        return file.location();
      }

      @Override
      public InputFile toInputFile() {
        return newInputFile(file.location());
      }
    }
  }

  /** A file read from its bytes in memory (written by this commit, or read already). */
  private static final class Held implements InputFile {
    private final String location;
    private final byte[] content;

    Held(String location, byte[] content) {
      this.location = location;
      this.content = content;
    }

    @Override
    public long getLength() {
      return content.length;
    }

    @Override
    public SeekableInputStream newStream() {
      return new SeekableInputStream() {
        private int at = 0;

        @Override
        public long getPos() {
          return at;
        }

        @Override
        public void seek(long newPos) {
          at = (int) newPos;
        }

        @Override
        public int read() {
          return at < content.length ? content[at++] & 0xff : -1;
        }

        @Override
        public int read(byte[] b, int off, int len) {
          if (len == 0) {
            return 0;
          }
          if (at >= content.length) {
            return -1;
          }
          int n = Math.min(len, content.length - at);
          System.arraycopy(content, at, b, off, n);
          at += n;
          return n;
        }
      };
    }

    @Override
    public String location() {
      return location;
    }

    @Override
    public boolean exists() {
      return true;
    }
  }
}
