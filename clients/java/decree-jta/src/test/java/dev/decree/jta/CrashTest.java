package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import org.junit.jupiter.api.AutoClose;
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
    /** The databases by rm name: pg-a, pg-b, maria. */
    static final Map<String, TestEnv.Db> dbs = new LinkedHashMap<>();
    @AutoClose
    static DecreeServer server;

    @BeforeAll
    static void setUp() throws Exception {
        for (TestEnv.Db db : List.of(TestEnv.pgA(), TestEnv.pgB(), TestEnv.maria())) {
            Bank.setUp(db);
            dbs.put(db.rm(), db);
        }
        server = DecreeServer.over(dbs.values().toArray(new TestEnv.Db[0])).start();
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
        TestEnv.Db from = dbs.get(fromRm);
        TestEnv.Db to = dbs.get(toRm);
        long total = Bank.balance(from) + Bank.balance(to);
        String transfer = "crash-" + UUID.randomUUID();
        CrashWorker.Killed killed = CrashWorker.killAtStep(TestEnv.java("", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Ddecree.parallel=" + Boolean.TRUE.equals(parallel), CrashWorker.class.getName(),
                server.endpoint(), step, transfer, from.rm(), from.jdbcUrl(), from.properties().getProperty("user"), to.rm(),
                to.jdbcUrl(), to.properties().getProperty("user")));
        String stepLine = killed.stepLine();
        assertTrue(stepLine != null && stepLine.startsWith("STEP " + step), "the worker reached " + step + ":\n" + killed.out());
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
