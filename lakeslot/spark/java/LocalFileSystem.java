/*
 * Hadoop's local file system, with permissions set through java.nio instead of a `chmod` process.
 *
 * Without Hadoop's native library (libhadoop, which neither pip nor Debian ships), Hadoop's
 * RawLocalFileSystem sets the permission of every file and directory it creates by spawning
 * `chmod`: twice per file with its checksum file. This class is Hadoop's own LocalFileSystem
 * (checksums included) over a raw layer whose only change is setPermission: the same nine
 * permission bits, set in-process. Built by lakeslot/spark/helpers.py; see its docstring.
 */
package lakeslot.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {
  public LocalFileSystem() {
    super(new Raw());
  }

  /** RawLocalFileSystem whose setPermission does not spawn a process. */
  public static class Raw extends RawLocalFileSystem {
    // bit i of a POSIX mode (0 = others' execute ... 8 = owner's read)
    private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path path, FsPermission permission) throws IOException {
      short mode = permission.toShort();
      Set<PosixFilePermission> bits = EnumSet.noneOf(PosixFilePermission.class);
      for (int bit = 0; bit < BITS.length; bit++) {
        if ((mode & (1 << bit)) != 0) {
          bits.add(BITS[bit]);
        }
      }
      Files.setPosixFilePermissions(pathToFile(path).toPath(), bits);
    }
  }
}
