package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.UUID;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.AutoClose;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * decree-jta over PostgreSQL URLs with pgjdbc's {@code preferQueryMode=extendedForPrepared},
 * which the Java README suggests for less CPU per transaction: pgjdbc then sends the check
 * and {@code PREPARE TRANSACTION} (and the check and the one-phase {@code COMMIT}) as one
 * query message, in which PostgreSQL skips the second statement when the first fails. These
 * tests hold the README to it: the one message is what pgjdbc sends (its own trace of the
 * protocol, {@code java.util.logging} at FINEST), and an aborted branch still rolls back, in
 * two phases and in one.
 */
class SimpleQueryModeTest {
    static final String MODE = "preferQueryMode=extendedForPrepared";
    static TestEnv.Db pgA;
    static TestEnv.Db pgB;
    @AutoClose
    static DecreeServer server;
    DecreeTransactionManager tm;
    DecreeDataSource a;
    DecreeDataSource b;

    static TestEnv.Db inMode(TestEnv.Db db) {
        return new TestEnv.Db(db.rm(), db.kind(), db.dsn(), db.jdbcUrl() + "?" + MODE, db.properties());
    }

    @BeforeAll
    static void setUp() throws Exception {
        pgA = inMode(TestEnv.pgA());
        pgB = inMode(TestEnv.pgB());
        Bank.setUp(pgA, pgB);
        server = new DecreeServer(List.of(DecreeServer.Rm.of(pgA), DecreeServer.Rm.of(pgB)), "").start();
    }

    @BeforeEach
    void connect() throws Exception {
        tm = DecreeTransactionManager.connect(server.endpoint());
        a = Bank.dataSource(tm, pgA, 4);
        b = Bank.dataSource(tm, pgB, 4);
    }

    @AfterEach
    void close() throws Exception {
        a.close();
        b.close();
        tm.close();
        assertEquals(List.of(), Bank.awaitNothingPrepared(server.node, 10, pgA, pgB), "nothing left prepared");
    }

    static String id() {
        return "j-" + UUID.randomUUID();
    }

    /** The queries pgjdbc sends in simple-query messages while {@code body} runs, one string per message. */
    static List<String> simpleQueries(Body body) throws Exception {
        Logger logger = Logger.getLogger("org.postgresql.core.v3.QueryExecutorImpl");
        List<String> out = Collections.synchronizedList(new ArrayList<>());
        Handler handler = new Handler() {
            @Override
            public void publish(LogRecord r) {
                if (r.getMessage() != null && r.getMessage().contains("FE=> SimpleQuery")) {
                    out.add(Arrays.toString(r.getParameters()));
                }
            }

            @Override
            public void flush() {}

            @Override
            public void close() {}
        };
        handler.setLevel(Level.ALL);
        Level before = logger.getLevel();
        logger.setLevel(Level.FINEST);
        logger.addHandler(handler);
        try {
            body.run();
        } finally {
            logger.removeHandler(handler);
            logger.setLevel(before);
        }
        return out;
    }

    interface Body {
        void run() throws Exception;
    }

    @Test
    void theCheckAndThePrepareGoInOneMessageAndTheTransferCommitsInBoth() throws Exception {
        String id = id();
        List<String> sent = simpleQueries(() -> {
            tm.begin();
            Bank.transfer(a, b, id, 5);
            tm.commit();
        });
        long together = sent.stream().filter(q -> q.contains("txid_current_if_assigned") && q.contains("PREPARE TRANSACTION")).count();
        assertEquals(2, together, "one message with the check and the PREPARE per branch: " + sent);
        assertTrue(Bank.has(pgA, id) && Bank.has(pgB, id));
    }

    @Test
    void anAbortedBranchDoesNotPrepareAndTheOtherRollsBack() throws Exception {
        AbortedBranch.failedStatementRollsBackEveryDatabase(tm, a, b, pgB);
    }

    @Test
    void aOnePhaseCommitOfAnAbortedTransactionIsReportedAsRolledBack() throws Exception {
        AbortedBranch.onePhaseCommitIsReportedAsRolledBack(tm, a, pgA);
    }

    @Test
    void aBranchThatOnlyReadVotesReadOnly() throws Exception {
        String id = id();
        tm.setParallelBranchCalls(false); // the branches prepared in the order they were enlisted.
        List<String> sent = simpleQueries(() -> {
            tm.begin();
            try (Connection c = a.getConnection(); Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT 1")) {
                r.next();
            }
            Bank.leg(b, id, 2);
            tm.commit();
        });
        // A read-only vote finishes the branch's empty prepared transaction at once, before the
        // next branch is prepared; a yes vote would leave it to phase two, after every prepare.
        int firstCommit = -1;
        int lastPrepare = -1;
        for (int i = 0; i < sent.size(); i++) {
            if (sent.get(i).contains("COMMIT PREPARED") && firstCommit < 0) {
                firstCommit = i;
            }
            if (sent.get(i).contains("txid_current_if_assigned") && sent.get(i).contains("PREPARE TRANSACTION")) {
                lastPrepare = i;
            }
        }
        assertTrue(firstCommit >= 0 && lastPrepare >= 0 && firstCommit < lastPrepare, "not a read-only vote: " + sent);
        assertTrue(Bank.has(pgB, id));
    }
}
