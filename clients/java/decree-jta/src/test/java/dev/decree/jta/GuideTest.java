package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * docs/guide.md's Java program, run as written ({@code java -cp ... Transfer.java}) against a
 * real server and the two PostgreSQL test databases, each in a schema of its own.
 */
class GuideTest {
    static final String MARKER = "<!-- guide-program-java:";

    /** The code block after {@code marker} in docs/guide.md. */
    static String block(String marker, String language) throws Exception {
        String guide = Files.readString(TestEnv.repo().resolve("docs/guide.md"));
        int at = guide.indexOf(marker);
        assertTrue(at >= 0, "no " + marker + " in docs/guide.md");
        int start = guide.indexOf("```" + language + "\n", at);
        int end = guide.indexOf("\n```\n", start);
        return guide.substring(start + language.length() + 4, end + 1);
    }

    @Test
    void theGuideProgramMovesMoney(@TempDir Path tmp) throws Exception {
        TestEnv.Db pgA = TestEnv.pg("pg-a", "DECREE_TEST_PG_A");
        TestEnv.Db pgB = TestEnv.pg("pg-b", "DECREE_TEST_PG_B");
        String schema = "guide_java_" + ProcessHandle.current().pid() + "_" + (System.nanoTime() % 1_000_000_000L);
        for (TestEnv.Db db : List.of(pgA, pgB)) {
            try (Connection c = Bank.plain(db); Statement s = c.createStatement()) {
                s.execute("CREATE SCHEMA " + schema);
            }
        }
        try (DecreeServer server = new DecreeServer(List.of(new DecreeServer.Rm("bank-a", "postgres", pgA.dsn()),
                new DecreeServer.Rm("bank-b", "postgres", pgB.dsn())), "").start()) {
            Path program = tmp.resolve("Transfer.java");
            Files.writeString(program, block(MARKER, "java"));
            ProcessBuilder pb = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp",
                    System.getProperty("java.class.path"), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", program.toString());
            pb.environment().put("DECREE", server.endpoint());
            pb.environment().put("BANK_A", pgA.jdbcUrl() + "?currentSchema=" + schema);
            pb.environment().put("BANK_B", pgB.jdbcUrl() + "?currentSchema=" + schema);
            pb.environment().put("BANK_USER", pgA.properties().getProperty("user"));
            pb.redirectError(tmp.resolve("stderr.txt").toFile());
            Process p = pb.start();
            String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            assertTrue(p.waitFor(120, TimeUnit.SECONDS));
            String err = Files.readString(tmp.resolve("stderr.txt"));
            assertEquals(0, p.exitValue(), out + err);
            assertEquals(List.of("A", "70", "B", "130"), List.of(out.trim().split("\\s+")), out + err);
            assertTrue(err.contains("not enough money to move 1000"), err);
            for (var e : List.of(new Object[] {pgA, 70L}, new Object[] {pgB, 130L})) {
                try (Connection c = Bank.plain((TestEnv.Db) e[0]); Statement s = c.createStatement();
                        ResultSet r = s.executeQuery("SELECT balance FROM " + schema + ".accounts WHERE id = 1")) {
                    assertTrue(r.next());
                    assertEquals(e[1], r.getLong(1));
                }
            }
            assertEquals(List.of(), Bank.awaitNothingPrepared(server.node, 10, pgA, pgB));
            assertEquals(1.0, server.metric("decree_commits_total"), "the first transfer took two phases: one decision");
        } finally {
            for (TestEnv.Db db : List.of(pgA, pgB)) {
                try (Connection c = Bank.plain(db); Statement s = c.createStatement()) {
                    s.execute("DROP SCHEMA IF EXISTS " + schema + " CASCADE");
                }
            }
        }
    }
}
