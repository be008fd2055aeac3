/*
 * A mirror's state as the apply job decides on it (lakeslot/spark/tables.py's Tables.load): its
 * position, its schema and its properties, in one call from Python; and its current snapshot
 * where it is at a position (Tables.snapshot_at, for each table of a pass's cut), in one call.
 *
 * Built for cost: read call by call, a table's state was about a dozen py4j calls (the current
 * snapshot, its summary, the schema and its JSON, the properties and theirs) and as many again
 * when Python's proxies of their results were collected — for every table in every pass, most
 * of a pass's prepare step once the tables were no longer read from the catalog each time.
 *
 * Invariants: the position is CommitOperations.position's (the current snapshot's value of the
 * property; a "replace" snapshot without it has its parent's); the schema is SchemaParser's JSON
 * (field IDs kept); the properties are the table's, all of them. A snapshot is "at" a position
 * when that position is the table's (numerically: the property's value is a decimal LSN).
 */
package lakeslot.iceberg;

import java.util.Map;
import org.apache.iceberg.HasTableOperations;
import org.apache.iceberg.SchemaParser;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.util.JsonUtil;

public final class TableStates {
  private TableStates() {}

  /**
   * {@code table}'s state as JSON: "position" (the value of the snapshot property {@code
   * property}, or null), "schema" (SchemaParser's JSON, as a string), "properties".
   */
  public static String of(Table table, String property) {
    String position = CommitOperations.position(((HasTableOperations) table).operations().current(), property);
    Map<String, String> properties = table.properties();
    String schema = SchemaParser.toJson(table.schema());
    return JsonUtil.generate(
        gen -> {
          gen.writeStartObject();
          gen.writeStringField("position", position);
          gen.writeStringField("schema", schema);
          gen.writeObjectFieldStart("properties");
          for (Map.Entry<String, String> entry : properties.entrySet()) {
            gen.writeStringField(entry.getKey(), entry.getValue());
          }
          gen.writeEndObject();
          gen.writeEndObject();
        },
        false);
  }

  /**
   * The ID of {@code table}'s current snapshot if the table is at {@code position} (the value of
   * the snapshot property {@code property}; null: none); if it is not, the table is refreshed (a
   * request) and asked again. Null when it is not at {@code position} then either.
   */
  public static Long snapshotAt(Table table, String property, String position) {
    Long wanted = position == null ? null : Long.valueOf(position);
    for (int attempt = 0; attempt < 2; attempt++) {
      if (attempt > 0) {
        table.refresh();
      }
      TableMetadata metadata = ((HasTableOperations) table).operations().current();
      Snapshot current = metadata.currentSnapshot();
      String at = CommitOperations.position(metadata, property);
      if (current != null && java.util.Objects.equals(wanted, at == null ? null : Long.valueOf(at))) {
        return current.snapshotId();
      }
    }
    return null;
  }
}
