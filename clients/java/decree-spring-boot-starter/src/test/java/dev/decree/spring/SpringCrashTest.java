package dev.decree.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.decree.jta.Bank;
import dev.decree.jta.DecreeServer;
import dev.decree.jta.SpringCrashWorker;
import dev.decree.jta.TestEnv;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * The Spring bank application killed (SIGKILL) in the middle of a {@code @Transactional}
 * method's commit: after both branches are prepared (nothing decided: rolled back in both)
 * and after the decision (committed in both). Nothing is half-done once the server has
 * recovered, and nothing is left prepared.
 */
class SpringCrashTest {
    static TestEnv.Db pgA;
    static TestEnv.Db maria;
    static DecreeServer server;

    @BeforeAll
    static void setUp() throws Exception {
        pgA = TestEnv.pg("pg-a", "DECREE_TEST_PG_A");
        maria = TestEnv.maria("maria", "DECREE_TEST_MARIADB");
        server = new DecreeServer(List.of(new DecreeServer.Rm("pg-a", "postgres", pgA.dsn()),
                new DecreeServer.Rm("maria", "mariadb", maria.dsn())), "").start();
    }

    @AfterAll
    static void tearDown() throws Exception {
        if (server != null) {
            server.close();
        }
    }

    static boolean has(TestEnv.Db db, String id) throws Exception {
        try (Connection c = Bank.plain(db); PreparedStatement p = c.prepareStatement("SELECT 1 FROM decree_spring_entry WHERE id = ?")) {
            p.setString(1, id);
            try (ResultSet r = p.executeQuery()) {
                return r.next();
            }
        }
    }

    @ParameterizedTest(name = "killed at {0}")
    @CsvSource({"prepared, false", "decided, true", "phase-two, true"})
    void aKilledApplicationLeavesNothingHalfDone(String step, boolean committed) throws Exception {
        String id = "spring-crash-" + UUID.randomUUID();
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp",
                System.getProperty("java.class.path"), SpringCrashWorker.class.getName(), step, id,
                "--decree.endpoint=" + server.endpoint(), "--decree.datasource.bankA.url=" + pgA.jdbcUrl(),
                "--decree.datasource.bankA.username=" + pgA.properties().getProperty("user"), "--decree.datasource.bankA.rm=pg-a",
                "--decree.datasource.bankB.url=" + maria.jdbcUrl(),
                "--decree.datasource.bankB.username=" + maria.properties().getProperty("user"), "--decree.datasource.bankB.rm=maria",
                "--logging.level.root=WARN"));
        Process child = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        StringBuilder out = new StringBuilder();
        String stepLine = null;
        try (BufferedReader r = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8))) {
            String line;
            while ((line = r.readLine()) != null) {
                out.append(line).append('\n');
                if (line.startsWith("STEP ")) {
                    stepLine = line;
                    child.destroyForcibly(); // SIGKILL
                    break;
                }
            }
        } finally {
            child.destroyForcibly();
            child.waitFor(20, TimeUnit.SECONDS);
        }
        assertTrue(stepLine != null, "the application reached " + step + ":\n" + out);
        assertEquals(List.of(), Bank.awaitNothingPrepared(server.node, 40, pgA, maria), server.logTail());
        assertEquals(committed, has(pgA, id), "database A (" + stepLine + ")");
        assertEquals(committed, has(maria, id), "database B (" + stepLine + ")");
    }
}
