package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.RollbackException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * decree-jta against a primary + backup pair (docs/replication.md): given both members it
 * finds the primary (the backup answers NotPrimary); after the primary is killed and the
 * backup promoted, the new primary answers the old one's transfers committed, and new
 * transfers run there under the new epoch; both databases agree, nothing left prepared.
 */
class PairTest {
    TestEnv.Db pgA;
    TestEnv.Db pgB;
    /** The node of the test's pair. */
    long node;

    @BeforeEach
    void setUp() throws Exception {
        pgA = TestEnv.pgA();
        pgB = TestEnv.pgB();
        Bank.setUp(pgA, pgB);
        node = java.util.concurrent.ThreadLocalRandom.current().nextLong(1_000_000, 1L << 31);
    }

    /** A new pair secret both members prove on their link (a temporary file is mode 0600 on POSIX). */
    static java.nio.file.Path pairSecret() throws java.io.IOException {
        java.nio.file.Path secret = java.nio.file.Files.createTempFile("decree-pair-", ".secret");
        byte[] bytes = new byte[32];
        new java.security.SecureRandom().nextBytes(bytes);
        java.nio.file.Files.writeString(secret, java.util.HexFormat.of().formatHex(bytes));
        // Outside any server's directory (both members read it): removed when the JVM ends.
        secret.toFile().deleteOnExit();
        return secret;
    }

    /** The {@code [pair]} section of member {@code id}, listening on {@code link}. */
    static String pairSection(int id, int link, int peerLink, java.nio.file.Path secret) {
        return "[pair]\nmember = " + id + "\nlink = \"127.0.0.1:" + link + "\"\npeer_link = \"127.0.0.1:" + peerLink
                + "\"\nsecret_file = \"" + secret + "\"\n";
    }

    /** Starts a pair of node {@link #node} on the two PostgreSQL databases, member 1 promoted and strict. */
    DecreeServer[] pair() throws Exception {
        List<DecreeServer.Rm> rms = List.of(DecreeServer.Rm.of(pgA), DecreeServer.Rm.of(pgB));
        int linkA = DecreeServer.freePort();
        int linkB = DecreeServer.freePort();
        java.nio.file.Path secret = pairSecret();
        DecreeServer a = new DecreeServer(rms, pairSection(1, linkA, linkB, secret), node);
        DecreeServer b = new DecreeServer(rms, pairSection(2, linkB, linkA, secret), node);
        try {
            a.start();
            b.start();
            assertTrue(a.control("promote", "--force").contains("leads epoch 1.1"));
            long deadline = System.nanoTime() + 30_000_000_000L;
            while (!a.control("status", "--format", "json").replace(" ", "").contains("\"strict\":true")) {
                assertTrue(System.nanoTime() < deadline, "the primary never turned strict");
                Thread.sleep(50);
            }
        } catch (Throwable t) {
            try (a; b) {
                throw t;
            }
        }
        return new DecreeServer[] {a, b};
    }

    /**
     * A Decide whose answer is lost at the failover: the primary is SIGKILLed while the
     * client waits, after it answered (its backup holds the decision: committed) or before it
     * saw the Decide (nobody decided: rolled back or unknown, never committed). The client
     * resolves it with Outcome on the new primary and the databases agree with the answer.
     */
    @org.junit.jupiter.params.ParameterizedTest(name = "lost: the {0}")
    @org.junit.jupiter.params.provider.ValueSource(strings = {"reply", "decide"})
    void aDecideWhoseAnswerIsLostAtTheFailoverIsResolvedOnTheNewPrimary(String hold) throws Exception {
        DecreeServer[] members = pair();
        DecreeServer a = members[0];
        DecreeServer b = members[1];
        try (a; b; DecideProxy proxy = new DecideProxy(a.socket, a.dir.resolve("proxy.sock"), hold.equals("reply"));
                DecreeTransactionManager tm = DecreeTransactionManager.connect(proxy.endpoint() + "," + b.endpoint());
                DecreeDataSource da = Bank.dataSource(tm, pgA, 2);
                DecreeDataSource db = Bank.dataSource(tm, pgB, 2)) {
            tm.setOutcomeTimeoutMillis(30_000);
            String id = "pair-lost-" + UUID.randomUUID();
            long total = Bank.balance(pgA) + Bank.balance(pgB);
            CompletableFuture<Object> commit = CompletableFuture.supplyAsync(() -> {
                try {
                    tm.begin();
                    Bank.transfer(da, db, id, 1);
                    proxy.armed = true;
                    tm.commit();
                    return "committed";
                } catch (Exception e) {
                    return e;
                }
            });
            assertTrue(proxy.lost.await(20, TimeUnit.SECONDS), "the Decide went through the proxy");
            Thread.sleep(hold.equals("reply") ? 300 : 0); // the primary answered (and its backup holds the decision)
            a.kill();
            proxy.memberDied();
            assertTrue(b.control("promote").contains("leads epoch 2.2"));
            Object result = commit.get(60, TimeUnit.SECONDS);
            assertEquals(List.of(), Bank.awaitNothingPrepared(node, 30, pgA, pgB), b.logTail());
            boolean inA = Bank.has(pgA, id);
            boolean inB = Bank.has(pgB, id);
            assertEquals(inA, inB, "in both databases or neither");
            if (hold.equals("reply")) {
                assertEquals("committed", result, "the new primary holds the decision: " + result);
                assertTrue(inA);
            } else {
                assertTrue(result instanceof RollbackException || result instanceof OutcomeUnknownException,
                        "never committed: " + result);
                assertTrue(!inA, "nobody decided: rolled back");
            }
            assertEquals(total, Bank.balance(pgA) + Bank.balance(pgB));
        }
    }

    @Test
    void theTransactionManagerFollowsThePairThroughAFailover() throws Exception {
        DecreeServer[] members = pair();
        DecreeServer a = members[0];
        DecreeServer b = members[1];
        try (a; b) {
            try (DecreeTransactionManager tm = DecreeTransactionManager.connect(b.endpoint() + "," + a.endpoint());
                    DecreeDataSource da = Bank.dataSource(tm, pgA, 2);
                    DecreeDataSource db = Bank.dataSource(tm, pgB, 2)) {
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
                    Bank.transfer(da, db, id, 1);
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
