package dev.decree.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.decree.jta.Bank;
import dev.decree.jta.DecreeServer;
import dev.decree.jta.TestEnv;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.Statement;
import java.util.List;
import java.util.concurrent.TimeUnit;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * docs/guide.md's Spring Boot application, compiled and run as written with its
 * application.properties, the addresses overridden on the command line, against a real
 * server and the two PostgreSQL test databases (a schema of its own in each).
 */
class GuideSpringTest {
    static String block(String marker, String language) throws Exception {
        String guide = Files.readString(TestEnv.repo().resolve("docs/guide.md"));
        int at = guide.indexOf(marker);
        assertTrue(at >= 0, "no " + marker + " in docs/guide.md");
        int start = guide.indexOf("```" + language + "\n", at);
        int end = guide.indexOf("\n```\n", start);
        return guide.substring(start + language.length() + 4, end + 1);
    }

    @Test
    void theGuidesSpringApplicationMovesMoney(@TempDir Path tmp) throws Exception {
        TestEnv.Db pgA = TestEnv.pg("pg-a", "DECREE_TEST_PG_A");
        TestEnv.Db pgB = TestEnv.pg("pg-b", "DECREE_TEST_PG_B");
        String schema = "guide_spring_" + ProcessHandle.current().pid() + "_" + (System.nanoTime() % 1_000_000_000L);
        for (TestEnv.Db db : List.of(pgA, pgB)) {
            try (Connection c = Bank.plain(db); Statement s = c.createStatement()) {
                s.execute("CREATE SCHEMA " + schema);
                s.execute("CREATE TABLE " + schema + ".accounts (id int PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0))");
                s.execute("INSERT INTO " + schema + ".accounts VALUES (1, 100)");
            }
        }
        try (DecreeServer server = new DecreeServer(List.of(new DecreeServer.Rm("bank-a", "postgres", pgA.dsn()),
                new DecreeServer.Rm("bank-b", "postgres", pgB.dsn())), "").start()) {
            Path src = tmp.resolve("src/bank/BankApplication.java");
            Files.createDirectories(src.getParent());
            Files.writeString(src, block("<!-- guide-program-spring:", "java"));
            Path classes = tmp.resolve("classes");
            Files.createDirectories(classes);
            Files.writeString(classes.resolve("application.properties"), block("<!-- guide-properties-spring:", "properties"));
            JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
            int rc = javac.run(null, null, null, "-d", classes.toString(), "-cp", System.getProperty("java.class.path"), "-parameters",
                    src.toString());
            assertEquals(0, rc, "the guide's application compiles");
            ProcessBuilder pb = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp",
                    classes + java.io.File.pathSeparator + System.getProperty("java.class.path"), "bank.BankApplication",
                    "--decree.endpoint=" + server.endpoint(),
                    "--decree.datasource.bankA.url=" + pgA.jdbcUrl() + "?currentSchema=" + schema,
                    "--decree.datasource.bankA.username=" + pgA.properties().getProperty("user"),
                    "--decree.datasource.bankB.url=" + pgB.jdbcUrl() + "?currentSchema=" + schema,
                    "--decree.datasource.bankB.username=" + pgB.properties().getProperty("user"),
                    "--logging.level.root=WARN", "--spring.main.banner-mode=off");
            pb.redirectError(tmp.resolve("stderr.txt").toFile());
            Process p = pb.start();
            String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            assertTrue(p.waitFor(120, TimeUnit.SECONDS));
            String err = Files.readString(tmp.resolve("stderr.txt"));
            assertEquals(0, p.exitValue(), out + err);
            assertTrue(out.contains("A 70 B 130"), out + err);
            assertTrue(err.contains("not enough money to move 1000"), err);
            assertEquals(List.of(), Bank.awaitNothingPrepared(server.node, 10, pgA, pgB));
            assertEquals(1.0, server.metric("decree_commits_total"), "the first transfer: one decision");
        } finally {
            for (TestEnv.Db db : List.of(pgA, pgB)) {
                try (Connection c = Bank.plain(db); Statement s = c.createStatement()) {
                    s.execute("DROP SCHEMA IF EXISTS " + schema + " CASCADE");
                }
            }
        }
    }
}
