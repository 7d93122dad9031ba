package dev.decree.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.decree.jta.Bank;
import dev.decree.jta.CrashWorker;
import dev.decree.jta.DecreeServer;
import dev.decree.jta.SpringCrashWorker;
import dev.decree.jta.TestEnv;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import org.junit.jupiter.api.AutoClose;
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
    @AutoClose
    static SpringBanks banks;

    @BeforeAll
    static void setUp() throws Exception {
        banks = new SpringBanks("");
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
        List<String> args = new ArrayList<>(List.of(SpringCrashWorker.class.getName(), step, id,
                "--decree.endpoint=" + banks.server.endpoint()));
        args.addAll(banks.arguments());
        args.add("--logging.level.root=WARN");
        CrashWorker.Killed killed = CrashWorker.killAtStep(TestEnv.java("", args.toArray(new String[0])));
        String stepLine = killed.stepLine();
        assertTrue(stepLine != null, "the application reached " + step + ":\n" + killed.out());
        assertEquals(List.of(), Bank.awaitNothingPrepared(banks.server.node, 40, banks.pgA, banks.maria), banks.server.logTail());
        assertEquals(committed, has(banks.pgA, id), "database A (" + stepLine + ")");
        assertEquals(committed, has(banks.maria, id), "database B (" + stepLine + ")");
    }
}
