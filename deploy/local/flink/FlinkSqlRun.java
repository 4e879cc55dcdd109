// Runs Flink SQL statements in a local mini cluster and prints the materialized result of the
// last SELECT as JSON lines. Started as a single-file program (`java -cp <flink jars> FlinkSqlRun.java
// file.sql`) by deploy/local/flink-sql: the PyPI distribution of Flink carries no SQL gateway,
// which the SQL client's embedded mode needs, so the Table API is driven directly.
//
// Materializing: the query's changelog is applied as Flink defines it: +I and +U add a row,
// -U and -D retract one equal row. The source must be bounded ('scan.bounded.mode') so the job ends.

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.flink.table.api.EnvironmentSettings;
import org.apache.flink.table.api.TableEnvironment;
import org.apache.flink.table.api.TableResult;
import org.apache.flink.types.Row;
import org.apache.flink.types.RowKind;
import org.apache.flink.util.CloseableIterator;

public class FlinkSqlRun {
    static final Pattern SET = Pattern.compile("(?is)SET\\s+'([^']+)'\\s*=\\s*'([^']*)'");

    public static void main(String[] args) throws Exception {
        String script = Files.readString(Path.of(args[0]));
        TableEnvironment env = TableEnvironment.create(EnvironmentSettings.inStreamingMode());
        env.getConfig().set("parallelism.default", "1");
        List<String> statements = new ArrayList<>();
        for (String part : script.split(";\\s*(\\n|$)")) {
            if (!part.strip().isEmpty()) statements.add(part.strip());
        }
        for (String statement : statements) {
            Matcher set = SET.matcher(statement);
            if (set.matches()) { // the SQL client's SET, which the Table API leaves to the client
                env.getConfig().set(set.group(1), set.group(2));
                continue;
            }
            TableResult result = env.executeSql(statement);
            if (!statement.toUpperCase().startsWith("SELECT")) {
                result.await();
                continue;
            }
            List<Row> rows = new ArrayList<>();
            try (CloseableIterator<Row> it = result.collect()) {
                while (it.hasNext()) {
                    Row row = it.next();
                    RowKind kind = row.getKind();
                    row.setKind(RowKind.INSERT);
                    if (kind == RowKind.INSERT || kind == RowKind.UPDATE_AFTER) {
                        rows.add(row);
                    } else if (!rows.remove(row)) {
                        throw new IllegalStateException("retraction of a row not in the result: " + kind + " " + row);
                    }
                }
            }
            StringBuilder out = new StringBuilder();
            for (Row row : rows) {
                out.append(json(row)).append('\n');
            }
            System.out.print(out);
            System.out.flush();
        }
    }

    static String json(Object v) {
        if (v == null) return "null";
        if (v instanceof Row row) {
            StringBuilder b = new StringBuilder("[");
            for (int i = 0; i < row.getArity(); i++) {
                if (i > 0) b.append(',');
                b.append(json(row.getField(i)));
            }
            return b.append(']').toString();
        }
        if (v instanceof Boolean || v instanceof Integer || v instanceof Long || v instanceof Short) return v.toString();
        if (v instanceof Float || v instanceof Double) {
            double d = ((Number) v).doubleValue();
            return Double.isFinite(d) ? v.toString() : quote(v.toString());
        }
        if (v instanceof Object[] items) {
            StringBuilder b = new StringBuilder("[");
            for (int i = 0; i < items.length; i++) {
                if (i > 0) b.append(',');
                b.append(json(items[i]));
            }
            return b.append(']').toString();
        }
        if (v instanceof Map<?, ?> map) {
            StringBuilder b = new StringBuilder("{");
            boolean first = true;
            for (Map.Entry<?, ?> e : map.entrySet()) {
                if (!first) b.append(',');
                first = false;
                b.append(quote(String.valueOf(e.getKey()))).append(':').append(json(e.getValue()));
            }
            return b.append('}').toString();
        }
        if (v instanceof byte[] bytes) return quote(java.util.HexFormat.of().formatHex(bytes));
        // BigDecimal, String, java.time values: their canonical text
        return quote(v.toString());
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
                }
            }
        }
        return b.append('"').toString();
    }
}
