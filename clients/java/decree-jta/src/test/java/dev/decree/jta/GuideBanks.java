package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.Statement;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * What a run of one of docs/guide.md's programs needs (GuideTest, and the starter's
 * GuideSpringTest): the two PostgreSQL test databases, each with a schema of its own, and a
 * server whose resource managers bank-a and bank-b are their databases. Closing it stops the
 * server and drops the schemas.
 */
public final class GuideBanks implements AutoCloseable {
    public final TestEnv.Db pgA = TestEnv.pgA();
    public final TestEnv.Db pgB = TestEnv.pgB();
    public final String schema;
    public final DecreeServer server;

    /** The code block after {@code marker} in docs/guide.md. */
    public static String block(String marker, String language) throws Exception {
        String guide = Files.readString(TestEnv.repo().resolve("docs/guide.md"));
        int at = guide.indexOf(marker);
        assertTrue(at >= 0, "no " + marker + " in docs/guide.md");
        int start = guide.indexOf("```" + language + "\n", at);
        int end = guide.indexOf("\n```\n", start);
        return guide.substring(start + language.length() + 4, end + 1);
    }

    /** The schema {@code prefix<pid>_<n>} in both databases, set up by {@code statements} ({@code %s}: the schema). */
    public GuideBanks(String prefix, String... statements) throws Exception {
        schema = prefix + ProcessHandle.current().pid() + "_" + (System.nanoTime() % 1_000_000_000L);
        for (TestEnv.Db db : List.of(pgA, pgB)) {
            try (Connection c = Bank.plain(db); Statement s = c.createStatement()) {
                s.execute("CREATE SCHEMA " + schema);
                for (String sql : statements) {
                    s.execute(sql.replace("%s", schema));
                }
            }
        }
        DecreeServer started;
        try {
            started = new DecreeServer(List.of(new DecreeServer.Rm("bank-a", "postgres", pgA.dsn()),
                    new DecreeServer.Rm("bank-b", "postgres", pgB.dsn())), "").start();
        } catch (Exception e) {
            dropSchemas();
            throw e;
        }
        server = started;
    }

    /** The JDBC URL of {@code db} in this schema. */
    public String url(TestEnv.Db db) {
        return db.jdbcUrl() + "?currentSchema=" + schema;
    }

    /**
     * Runs {@code pb} (its standard error in {@code tmp}) to its successful end, which tells
     * of the guide's refused transfer: its output, then its standard error.
     */
    public static String[] run(ProcessBuilder pb, Path tmp) throws Exception {
        pb.redirectError(tmp.resolve("stderr.txt").toFile());
        Process p = pb.start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(p.waitFor(120, TimeUnit.SECONDS));
        String err = Files.readString(tmp.resolve("stderr.txt"));
        assertEquals(0, p.exitValue(), out + err);
        assertTrue(err.contains("not enough money to move 1000"), err);
        return new String[] {out, err};
    }

    /** Nothing left prepared in either database, and the server took one decision ({@code why}). */
    public void assertOneDecisionAndNothingPrepared(String why) throws Exception {
        assertEquals(List.of(), Bank.awaitNothingPrepared(server.node, 10, pgA, pgB));
        assertEquals(1.0, server.metric("decree_commits_total"), why);
    }

    private void dropSchemas() throws Exception {
        for (TestEnv.Db db : List.of(pgA, pgB)) {
            try (Connection c = Bank.plain(db); Statement s = c.createStatement()) {
                s.execute("DROP SCHEMA IF EXISTS " + schema + " CASCADE");
            }
        }
    }

    @Override
    public void close() throws Exception {
        try {
            server.close();
        } finally {
            dropSchemas();
        }
    }
}
