/*
 * The manifests' rewrite after a compaction (lakeslot/spark/maintenance.py), on the driver in
 * one call: Iceberg's core RewriteManifests, clustered into one group.
 *
 * Built for cost: Spark's rewriteManifests action is a Spark job, ≈ 0.3 s of a small table's
 * 0.5-s compaction, for a handful of manifests that hold a few entries (most of them none, once
 * the compaction has replaced their files). Java because clustering takes a Java function.
 *
 * Invariants: data manifests only, their live entries rewritten whole (Iceberg validates that
 * the entries added equal those replaced), the delete manifests kept; one commit or none. For an
 * unpartitioned table only: one group is what a partition-clustered rewrite gives it; the
 * caller rewrites a partitioned table's manifests with Spark's action, which keeps them
 * clustered by partition.
 *
 * Round trips: where the table's files are not on local disk its manifests are read several at
 * a time and the commit goes through CommitOperations, as a compaction's (Compactions.java).
 */
package lakeslot.iceberg;

import java.util.Map;
import org.apache.iceberg.RewriteManifests;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.relocated.com.google.common.base.Preconditions;
import org.apache.iceberg.util.JsonUtil;

public final class Manifests {
  private Manifests() {}

  /**
   * Rewrite the unpartitioned {@code table}'s data manifests into one group, in one commit whose
   * summary carries {@code properties} (a JSON object of strings). Returns, as JSON, how many
   * manifests it replaced and created ("replaced", "created"), and the new snapshot's
   * "manifest_list".
   */
  public static String rewrite(Table table, String properties) {
    Preconditions.checkArgument(table.spec().isUnpartitioned(), "%s is partitioned", table.name());
    boolean remote = !RowDeltas.local(table.location());
    Table committing = remote ? RowDeltas.known(table, null, null) : table;
    RewriteManifests rewrite = committing.rewriteManifests().clusterBy(file -> "")
        .scanManifestsWith(remote ? RowDeltas.WRITERS : RowDeltas.DIRECT);
    RowDeltas.summarized(rewrite, JsonUtil.parse(properties, node -> node)).commit();
    Snapshot current = table.currentSnapshot();  // (CommitOperations holds the table's own)
    Map<String, String> summary = current.summary();
    return JsonUtil.generate(
        gen -> {
          gen.writeStartObject();
          gen.writeNumberField("replaced", Integer.parseInt(summary.getOrDefault("manifests-replaced", "0")));
          gen.writeNumberField("created", Integer.parseInt(summary.getOrDefault("manifests-created", "0")));
          gen.writeStringField("manifest_list", current.manifestListLocation());
          gen.writeEndObject();
        },
        false);
  }
}
