package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * docs/guide.md's Java program, run as written ({@code java -cp ... Transfer.java}) against a
 * real server and the two PostgreSQL test databases, each in a schema of its own.
 */
class GuideTest {
    static final String MARKER = "<!-- guide-program-java:";

    @Test
    void theGuideProgramMovesMoney(@TempDir Path tmp) throws Exception {
        try (GuideBanks banks = new GuideBanks("guide_java_")) {
            Path program = tmp.resolve("Transfer.java");
            Files.writeString(program, GuideBanks.block(MARKER, "java"));
            ProcessBuilder pb = TestEnv.java("", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", program.toString());
            pb.environment().put("DECREE", banks.server.endpoint());
            pb.environment().put("BANK_A", banks.url(banks.pgA));
            pb.environment().put("BANK_B", banks.url(banks.pgB));
            pb.environment().put("BANK_USER", banks.pgA.properties().getProperty("user"));
            String[] outErr = GuideBanks.run(pb, tmp);
            String out = outErr[0];
            assertEquals(List.of("A", "70", "B", "130"), List.of(out.trim().split("\\s+")), out + outErr[1]);
            for (var e : List.of(new Object[] {banks.pgA, 70L}, new Object[] {banks.pgB, 130L})) {
                try (Connection c = Bank.plain((TestEnv.Db) e[0]); Statement s = c.createStatement();
                        ResultSet r = s.executeQuery("SELECT balance FROM " + banks.schema + ".accounts WHERE id = 1")) {
                    assertTrue(r.next());
                    assertEquals(e[1], r.getLong(1));
                }
            }
            banks.assertOneDecisionAndNothingPrepared("the first transfer took two phases: one decision");
        }
    }
}
