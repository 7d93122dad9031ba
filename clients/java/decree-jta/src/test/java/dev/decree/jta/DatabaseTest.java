package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.RollbackException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.UUID;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.AutoClose;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * decree-jta over the real databases of scripts/test-dbs.sh (two PostgreSQL databases and a
 * MariaDB one) and a real {@code decree serve}: commits and rollbacks across two databases,
 * one-phase commits, read-only branches, failed statements, and the branch names the
 * databases hold while prepared (decree's gid, the MariaDB name with the connection id).
 */
class DatabaseTest {
    static TestEnv.Db pgA;
    static TestEnv.Db pgB;
    static TestEnv.Db maria;
    @AutoClose
    static DecreeServer server;
    DecreeTransactionManager tm;
    DecreeDataSource a;
    DecreeDataSource b;
    DecreeDataSource m;

    @BeforeAll
    static void setUp() throws Exception {
        pgA = TestEnv.pgA();
        pgB = TestEnv.pgB();
        maria = TestEnv.maria();
        Bank.setUp(pgA, pgB, maria);
        server = new DecreeServer(List.of(DecreeServer.Rm.of(pgA), DecreeServer.Rm.of(pgB), DecreeServer.Rm.of(maria),
                new DecreeServer.Rm("d", "dummy", null)), "").start();
    }

    @BeforeEach
    void connect() throws Exception {
        tm = DecreeTransactionManager.connect(server.endpoint());
        a = Bank.dataSource(tm, pgA, 4);
        b = Bank.dataSource(tm, pgB, 4);
        m = Bank.dataSource(tm, maria, 4);
    }

    @AfterEach
    void close() throws Exception {
        a.close();
        b.close();
        m.close();
        tm.close();
        assertEquals(List.of(), Bank.awaitNothingPrepared(server.node, 10, pgA, pgB, maria), "nothing left prepared");
    }

    static String id() {
        return "j-" + UUID.randomUUID();
    }

    /** Begins a transaction with a new transfer of {@code amount} in it: the transfer's id. */
    String beginTransfer(DecreeDataSource from, DecreeDataSource to, long amount) throws Exception {
        String id = id();
        tm.begin();
        Bank.transfer(from, to, id, amount);
        return id;
    }

    @Test
    void aTransferBetweenTwoPostgresDatabasesCommitsInBoth() throws Exception {
        long total = Bank.balance(pgA) + Bank.balance(pgB);
        String id = beginTransfer(a, b, 7);
        tm.commit();
        assertTrue(Bank.has(pgA, id) && Bank.has(pgB, id));
        assertEquals(total, Bank.balance(pgA) + Bank.balance(pgB));
    }

    @Test
    void aTransferBetweenPostgresAndMariaDbCommitsInBothAndRollsBackInBoth() throws Exception {
        String id = beginTransfer(a, m, 3);
        tm.commit();
        assertTrue(Bank.has(pgA, id) && Bank.has(maria, id));

        String id2 = beginTransfer(m, a, 3);
        tm.rollback();
        assertFalse(Bank.has(pgA, id2) || Bank.has(maria, id2));
    }

    @Test
    void rollbackOnlyRollsBackBothDatabases() throws Exception {
        String id = beginTransfer(a, b, 5);
        tm.setRollbackOnly();
        assertThrows(RollbackException.class, tm::commit);
        assertFalse(Bank.has(pgA, id) || Bank.has(pgB, id));
    }

    @Test
    void oneDatabaseCommitsInOnePhase() throws Exception {
        for (DecreeDataSource ds : List.of(a, m)) {
            String id = id();
            double commits = server.metric("decree_commits_total");
            tm.begin();
            DecreeXid xid = ((DecreeTransaction) tm.getTransaction()).xid();
            Bank.leg(ds, id, 1);
            tm.commit();
            assertTrue(Bank.has(ds == a ? pgA : maria, id));
            assertEquals(commits, server.metric("decree_commits_total"), "no decision for one branch");
            assertEquals(Outcome.COMMITTED, tm.outcome(xid));
        }
    }

    @Test
    void aFailedStatementRollsBackEveryDatabase() throws Exception {
        AbortedBranch.failedStatementRollsBackEveryDatabase(tm, a, m, maria);
    }

    /** PostgreSQL answers COMMIT in an aborted transaction with a silent ROLLBACK: the one-phase commit must say so. */
    @Test
    void aOnePhaseCommitOfAnAbortedPostgresqlTransactionIsReportedAsRolledBack() throws Exception {
        AbortedBranch.onePhaseCommitIsReportedAsRolledBack(tm, a, pgA);
    }

    @Test
    void aBranchThatOnlyReadVotesReadOnlyAndLeavesTheDecision() throws Exception {
        String id = id();
        tm.begin();
        try (Connection c = a.getConnection(); Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT 1")) {
            r.next();
        }
        Bank.leg(b, id, 2);
        Bank.leg(m, id, -2);
        tm.commit();
        assertTrue(Bank.has(pgB, id) && Bank.has(maria, id));
    }

    @Test
    void theSameTransactionGetsTheSameConnectionAndItsBranchRefusesLocalCommits() throws Exception {
        String id = id();
        tm.begin();
        try (Connection c = a.getConnection()) {
            Bank.leg(c, id, 1);
            assertThrows(SQLException.class, c::commit);
            assertThrows(SQLException.class, c::rollback);
            assertThrows(SQLException.class, () -> c.setAutoCommit(true));
        }
        try (Connection c = a.getConnection(); PreparedStatement p = c.prepareStatement("SELECT 1 FROM decree_java_ledger WHERE transfer = ?")) {
            p.setString(1, id);
            try (ResultSet r = p.executeQuery()) {
                assertTrue(r.next(), "the second handle is on the branch of the first");
            }
        }
        tm.rollback();
        assertEquals(1, a.openConnections());
        try (Connection c = a.getConnection()) {
            assertTrue(c.getAutoCommit(), "outside a transaction: an ordinary autocommit connection");
        }
    }

    /** The branch names the databases hold while prepared, read by a third (dummy) branch that prepares last. */
    @Test
    void preparedBranchesCarryDecreesNamesInTheDatabases() throws Exception {
        List<String> seen = new ArrayList<>();
        List<Long> mariaIds = new ArrayList<>();
        tm.setParallelBranchCalls(false); // the third branch prepares after the first two.
        tm.begin();
        DecreeXid xid = ((DecreeTransaction) tm.getTransaction()).xid();
        String id = id();
        Bank.transfer(a, m, id, 1);
        try (Connection c = m.getConnection(); Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT CONNECTION_ID()")) {
            r.next();
            mariaIds.add(r.getLong(1));
        }
        FakeResource last = new FakeResource("d", FakeResource.journal());
        last.onPrepare = () -> {
            try {
                seen.addAll(Bank.prepared(pgA, server.node));
                seen.addAll(Bank.prepared(maria, server.node));
                try (Connection c = Bank.plain(maria); Statement s = c.createStatement(); ResultSet r = s.executeQuery("XA RECOVER")) {
                    while (r.next()) {
                        DecreeXid x = DecreeXid.fromXaRecover(r.getInt(1), r.getInt(2), r.getInt(3), r.getBytes(4));
                        if (x.branchOfMariadbName().equals(xid.branch(1))) {
                            seen.add("bqual " + HexFormat.of().formatHex(x.getBranchQualifier()));
                        }
                    }
                }
            } catch (SQLException e) {
                throw new IllegalStateException(e);
            }
        };
        tm.getTransaction().enlistResource(last);
        tm.commit();
        assertTrue(seen.contains(xid.branch(0).pgGid()), "PostgreSQL holds decree's gid, not pgjdbc's base64 form: " + seen);
        assertTrue(seen.contains(xid.branch(1).mariadbName(mariaIds.get(0)).toString()), seen.toString());
        assertTrue(seen.contains("bqual 0001" + String.format("%016x", mariaIds.get(0))), "10-byte bqual: " + seen);
        assertTrue(Bank.has(pgA, id) && Bank.has(maria, id));
    }
}
