package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * A JVM moving money between two databases is killed (SIGKILL) at each step of the commit;
 * the server finishes or rolls back every branch: the transfer is in both databases or in
 * neither (in both once the decision was acknowledged, in neither before it was sent), the
 * money adds up, and nothing is left prepared. PostgreSQL to PostgreSQL (decree's gid, which
 * pgjdbc's own XAResource would not have written) and PostgreSQL to MariaDB (the branch
 * attached to the killed JVM's connection).
 */
class CrashTest {
    static TestEnv.Db pgA;
    static TestEnv.Db pgB;
    static TestEnv.Db maria;
    static DecreeServer server;

    @BeforeAll
    static void setUp() throws Exception {
        pgA = TestEnv.pg("pg-a", "DECREE_TEST_PG_A");
        pgB = TestEnv.pg("pg-b", "DECREE_TEST_PG_B");
        maria = TestEnv.maria("maria", "DECREE_TEST_MARIADB");
        for (TestEnv.Db db : List.of(pgA, pgB, maria)) {
            Bank.setUp(db);
        }
        server = new DecreeServer(List.of(new DecreeServer.Rm("pg-a", "postgres", pgA.dsn()),
                new DecreeServer.Rm("pg-b", "postgres", pgB.dsn()), new DecreeServer.Rm("maria", "mariadb", maria.dsn())), "").start();
    }

    @AfterAll
    static void tearDown() throws Exception {
        if (server != null) {
            server.close();
        }
    }

    static TestEnv.Db db(String rm) {
        return switch (rm) {
            case "pg-a" -> pgA;
            case "pg-b" -> pgB;
            default -> maria;
        };
    }

    @ParameterizedTest(name = "{1} to {2}, killed at {0}, parallel branch calls {4}")
    @CsvSource({
        "prepared, pg-a, pg-b, neither, false", "decide-sent, pg-a, pg-b, either, false", "decided, pg-a, pg-b, both, false",
        "phase-two, pg-a, pg-b, both, false",
        "prepared, pg-a, maria, neither, false", "decide-sent, pg-a, maria, either, false", "decided, pg-a, maria, both, false",
        "phase-two, pg-a, maria, both, false", "phase-two, maria, pg-a, both, false", "prepared, maria, pg-a, neither, false",
        "prepared, pg-a, maria, neither, true", "decided, pg-a, maria, both, true", "phase-two, pg-a, pg-b, both, true"})
    void aKilledJvmsBranchesAreFinishedByTheServer(String step, String fromRm, String toRm, String expected, Boolean parallel)
            throws Exception {
        TestEnv.Db from = db(fromRm);
        TestEnv.Db to = db(toRm);
        long total = Bank.balance(from) + Bank.balance(to);
        String transfer = "crash-" + UUID.randomUUID();
        List<String> cmd = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp",
                System.getProperty("java.class.path"), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Ddecree.parallel=" + Boolean.TRUE.equals(parallel), CrashWorker.class.getName(),
                server.endpoint(), step, transfer, from.rm(), from.jdbcUrl(), from.properties().getProperty("user"), to.rm(),
                to.jdbcUrl(), to.properties().getProperty("user")));
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
        assertTrue(stepLine != null && stepLine.startsWith("STEP " + step), "the worker reached " + step + ":\n" + out);
        assertEquals(List.of(), Bank.awaitNothingPrepared(server.node, 40, from, to), "the server finished every branch:\n"
                + server.logTail());
        boolean inFrom = Bank.has(from, transfer);
        boolean inTo = Bank.has(to, transfer);
        assertEquals(inFrom, inTo, "the transfer is in both databases or in neither (" + stepLine + ")");
        switch (expected) {
            case "both" -> assertTrue(inFrom, "decided before the kill: committed in both");
            case "neither" -> assertTrue(!inFrom, "undecided at the kill: rolled back in both");
            default -> {
                // the decision was written: the server may have read it before the kill, or not.
            }
        }
        assertEquals(total, Bank.balance(from) + Bank.balance(to), "the money adds up");
    }
}
