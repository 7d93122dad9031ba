package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import org.junit.jupiter.api.Test;

/**
 * decree-jta against a primary + backup pair (docs/replication.md): given both members it
 * finds the primary (the backup answers NotPrimary); after the primary is killed and the
 * backup promoted, the new primary answers the old one's transfers committed, and new
 * transfers run there under the new epoch; both databases agree, nothing left prepared.
 */
class PairTest {
    @Test
    void theTransactionManagerFollowsThePairThroughAFailover() throws Exception {
        TestEnv.Db pgA = TestEnv.pg("pg-a", "DECREE_TEST_PG_A");
        TestEnv.Db pgB = TestEnv.pg("pg-b", "DECREE_TEST_PG_B");
        Bank.setUp(pgA);
        Bank.setUp(pgB);
        List<DecreeServer.Rm> rms = List.of(new DecreeServer.Rm("pg-a", "postgres", pgA.dsn()),
                new DecreeServer.Rm("pg-b", "postgres", pgB.dsn()));
        int linkA = DecreeServer.freePort();
        int linkB = DecreeServer.freePort();
        long node = java.util.concurrent.ThreadLocalRandom.current().nextLong(1_000_000, 1L << 31);
        try (DecreeServer a = new DecreeServer(rms, "[pair]\nmember = 1\nlink = \"127.0.0.1:" + linkA + "\"\npeer_link = \"127.0.0.1:"
                + linkB + "\"\n", node);
                DecreeServer b = new DecreeServer(rms, "[pair]\nmember = 2\nlink = \"127.0.0.1:" + linkB + "\"\npeer_link = \"127.0.0.1:"
                        + linkA + "\"\n", node)) {
            a.start();
            b.start();
            assertTrue(a.control("promote", "--force").contains("leads epoch 1.1"));
            long deadline = System.nanoTime() + 30_000_000_000L;
            while (!a.control("status", "--format", "json").replace(" ", "").contains("\"strict\":true")) {
                assertTrue(System.nanoTime() < deadline, "the primary never turned strict");
                Thread.sleep(50);
            }
            try (DecreeTransactionManager tm = DecreeTransactionManager.connect(b.endpoint() + "," + a.endpoint());
                    DecreeDataSource da = new DecreeDataSource(tm, "pg-a", pgA.jdbcUrl(), pgA.properties(), 2);
                    DecreeDataSource db = new DecreeDataSource(tm, "pg-b", pgB.jdbcUrl(), pgB.properties(), 2)) {
                assertEquals(a.endpoint(), tm.endpoint().toString(), "the backup refused, the primary serves");
                List<DecreeXid> xids = new ArrayList<>();
                List<String> ids = new ArrayList<>();
                for (int i = 0; i < 6; i++) {
                    if (i == 5) {
                        a.kill();
                        assertTrue(b.control("promote").contains("leads epoch 2.2"));
                        for (DecreeXid x : xids) {
                            assertEquals(Outcome.COMMITTED, tm.outcome(x), "the new primary knows " + x);
                        }
                    }
                    String id = "pair-" + UUID.randomUUID();
                    ids.add(id);
                    tm.begin();
                    xids.add(((DecreeTransaction) tm.getTransaction()).xid());
                    try (Connection c = da.getConnection()) {
                        Bank.leg(c, id, -1);
                    }
                    try (Connection c = db.getConnection()) {
                        Bank.leg(c, id, 1);
                    }
                    tm.commit();
                }
                assertEquals(b.endpoint(), tm.endpoint().toString());
                assertEquals((2L << 8) | 2, xids.get(5).incarnation(), "the new epoch");
                assertEquals(List.of(), Bank.awaitNothingPrepared(node, 20, pgA, pgB));
                for (String id : ids) {
                    assertTrue(Bank.has(pgA, id) && Bank.has(pgB, id), id);
                }
            }
        }
    }
}
