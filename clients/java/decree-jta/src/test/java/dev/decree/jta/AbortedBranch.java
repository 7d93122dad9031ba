package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.RollbackException;
import java.sql.Connection;
import java.sql.SQLException;
import java.util.UUID;

/**
 * A PostgreSQL branch aborted by a failed statement (a duplicate key), committed two ways;
 * shared by the tests that run it under different driver settings ({@link DatabaseTest},
 * {@link SimpleQueryModeTest}). PostgreSQL answers {@code PREPARE TRANSACTION} and
 * {@code COMMIT} in an aborted transaction with a silent rollback, so the commit must fail.
 */
final class AbortedBranch {
    private AbortedBranch() {}

    /** A new ledger row in {@code pg}, committed: a duplicate key for the next statement that inserts it. */
    private static String committedRow(DecreeTransactionManager tm, DecreeDataSource pg) throws Exception {
        String dup = "j-" + UUID.randomUUID();
        tm.begin();
        Bank.leg(pg, dup, 1);
        tm.commit();
        return dup;
    }

    /** Two phases: the aborted branch does not prepare, and the other database's branch rolls back. */
    static void failedStatementRollsBackEveryDatabase(DecreeTransactionManager tm, DecreeDataSource pg, DecreeDataSource other,
            TestEnv.Db otherDb) throws Exception {
        String dup = committedRow(tm, pg);
        String id = "j-" + UUID.randomUUID();
        tm.begin();
        Bank.leg(other, id, 1);
        try (Connection c = pg.getConnection()) {
            assertThrows(SQLException.class, () -> Bank.leg(c, dup, 1));
        }
        RollbackException e = assertThrows(RollbackException.class, tm::commit);
        assertTrue(e.getMessage().contains("did not prepare"), e.getMessage());
        assertFalse(Bank.has(otherDb, id));
    }

    /** One phase: the commit is reported as rolled back, and the row written before the failure is not there. */
    static void onePhaseCommitIsReportedAsRolledBack(DecreeTransactionManager tm, DecreeDataSource pg, TestEnv.Db pgDb)
            throws Exception {
        String dup = committedRow(tm, pg);
        String id = "j-" + UUID.randomUUID();
        tm.begin();
        try (Connection c = pg.getConnection()) {
            Bank.leg(c, id, 1);
            assertThrows(SQLException.class, () -> Bank.leg(c, dup, 1));
        }
        assertThrows(RollbackException.class, tm::commit);
        assertFalse(Bank.has(pgDb, id));
        assertTrue(Bank.has(pgDb, dup));
    }
}
