package dev.decree.jta;

import java.net.URI;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.Assumptions;

/**
 * Where the repository, the decree binary and the test databases are. Without the databases
 * ({@code DECREE_TEST_PG_A}, {@code DECREE_TEST_PG_B}, {@code DECREE_TEST_MARIADB}) or the
 * binary (target/release/decree, or {@code DECREE_BIN}) a test that needs them is skipped
 * with the reason; with {@code CI=true} it fails instead, so that CI cannot pass by skipping.
 */
public final class TestEnv {
    private TestEnv() {}

    static final boolean CI = "true".equals(System.getenv("CI")) || "1".equals(System.getenv("CI"));

    public static Path repo() {
        String env = System.getenv("DECREE_REPO");
        Path p = env != null ? Path.of(env) : Path.of("").toAbsolutePath();
        p = p.toAbsolutePath().normalize();
        while (p != null && !Files.isDirectory(p.resolve("docs/vectors"))) {
            p = p.getParent();
        }
        if (p == null) {
            throw new IllegalStateException("cannot find the repository (docs/vectors) above " + Path.of("").toAbsolutePath());
        }
        return p;
    }

    public static void need(String what, String hint) {
        String message = what + " is missing: " + hint;
        if (CI) {
            Assertions.fail("CI=true but " + message);
        }
        Assumptions.abort(message);
    }

    public static Path decreeBin() {
        String env = System.getenv("DECREE_BIN");
        Path p = env != null ? Path.of(env) : repo().resolve("target/release/decree");
        if (!Files.isRegularFile(p)) {
            need(p.toString(), "build it with cargo build --release -p decree-cli (or set DECREE_BIN)");
        }
        return p;
    }

    /** A JVM like this one that runs {@code args}, with {@code classPathBefore} in front of this one's class path. */
    public static ProcessBuilder java(String classPathBefore, String... args) {
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp",
                classPathBefore + System.getProperty("java.class.path")));
        cmd.addAll(List.of(args));
        return new ProcessBuilder(cmd);
    }

    static String env(String var) {
        String v = System.getenv(var);
        if (v == null || v.isEmpty()) {
            need(var, "run scripts/test-dbs.sh start && eval \"$(scripts/test-dbs.sh env)\"");
        }
        return v;
    }

    /** A JDBC database: its URL, its properties, and the server's DSN for the same database. */
    public record Db(String rm, String kind, String dsn, String jdbcUrl, Properties properties) {}

    /** The test databases under the rm names the tests give them: pg-a, pg-b (PostgreSQL), maria (MariaDB). */
    public static Db pgA() {
        return pg("pg-a", "DECREE_TEST_PG_A");
    }

    public static Db pgB() {
        return pg("pg-b", "DECREE_TEST_PG_B");
    }

    public static Db maria() {
        return maria("maria", "DECREE_TEST_MARIADB");
    }

    /** A PostgreSQL DSN {@code host=... port=... user=... dbname=...} as a JDBC database. */
    public static Db pg(String rm, String var) {
        String dsn = env(var);
        Properties kv = new Properties();
        for (String part : dsn.trim().split("\\s+")) {
            int eq = part.indexOf('=');
            kv.setProperty(part.substring(0, eq), part.substring(eq + 1));
        }
        Properties p = new Properties();
        p.setProperty("user", kv.getProperty("user", "postgres"));
        if (kv.getProperty("password") != null) {
            p.setProperty("password", kv.getProperty("password"));
        }
        String url = "jdbc:postgresql://" + kv.getProperty("host", "127.0.0.1") + ":" + kv.getProperty("port", "5432") + "/"
                + kv.getProperty("dbname");
        return new Db(rm, "postgres", dsn, url, p);
    }

    /** A MariaDB URL {@code mysql://user[:password]@host:port/db} as a JDBC database. */
    public static Db maria(String rm, String var) {
        String dsn = env(var);
        URI u = URI.create(dsn);
        Properties p = new Properties();
        String info = u.getUserInfo() == null ? "root" : u.getUserInfo();
        int colon = info.indexOf(':');
        p.setProperty("user", colon < 0 ? info : info.substring(0, colon));
        if (colon >= 0) {
            p.setProperty("password", info.substring(colon + 1));
        }
        String url = "jdbc:mariadb://" + u.getHost() + ":" + (u.getPort() < 0 ? 3306 : u.getPort()) + u.getPath();
        return new Db(rm, "mariadb", dsn, url, p);
    }
}
