package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.RollbackException;
import jakarta.transaction.Status;
import java.sql.Connection;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicBoolean;
import org.junit.jupiter.api.Test;

/**
 * The server killed (SIGKILL) and restarted under a workload of transfers between
 * PostgreSQL and MariaDB: every transfer whose commit returned is in both databases, every
 * one that rolled back is in neither, an unknown one is in both or neither, the money adds
 * up, and nothing is left prepared once the server has recovered.
 */
class ServerRestartTest {
    enum Result { COMMITTED, ROLLED_BACK, UNKNOWN, NOT_BEGUN }

    @Test
    void transfersStayAtomicWhileTheServerIsKilledAndRestarted() throws Exception {
        TestEnv.Db pgA = TestEnv.pgA();
        TestEnv.Db maria = TestEnv.maria();
        Bank.setUp(pgA, maria);
        long total = Bank.balance(pgA) + Bank.balance(maria);
        String prefix = "restart-" + UUID.randomUUID().toString().substring(0, 8) + "-";
        Map<String, Result> results = new ConcurrentHashMap<>();
        try (DecreeServer server = DecreeServer.over(pgA, maria).start();
                DecreeTransactionManager tm = DecreeTransactionManager.connect(server.endpoint(),
                        SessionOptions.defaults().withReplyTimeoutMs(2000))) {
            tm.setOutcomeTimeoutMillis(20_000);
            DecreeDataSource a = Bank.dataSource(tm, pgA, 4);
            DecreeDataSource m = Bank.dataSource(tm, maria, 4);
            AtomicBoolean stop = new AtomicBoolean();
            List<Thread> workers = new ArrayList<>();
            for (int t = 0; t < 2; t++) {
                Thread w = new Thread(() -> {
                    int n = 0;
                    while (!stop.get()) {
                        String id = prefix + Thread.currentThread().getName() + "-" + n++;
                        results.put(id, transfer(tm, a, m, id));
                    }
                }, "w" + t);
                w.start();
                workers.add(w);
            }
            for (int round = 0; round < 3; round++) {
                Thread.sleep(1500);
                server.kill();
                Thread.sleep(300);
                server.start();
            }
            Thread.sleep(1500);
            stop.set(true);
            for (Thread w : workers) {
                w.join(60_000);
            }
            a.close();
            m.close();
            assertEquals(List.of(), Bank.awaitNothingPrepared(server.node, 40, pgA, maria), server.logTail());
        }
        long committed = results.values().stream().filter(r -> r == Result.COMMITTED).count();
        assertTrue(committed > 5, "the workload committed transfers between the kills: " + results.values());
        List<String> wrong = new ArrayList<>();
        for (Map.Entry<String, Result> e : results.entrySet()) {
            boolean inA = Bank.has(pgA, e.getKey());
            boolean inM = Bank.has(maria, e.getKey());
            boolean ok = switch (e.getValue()) {
                case COMMITTED -> inA && inM;
                case ROLLED_BACK, NOT_BEGUN -> !inA && !inM;
                case UNKNOWN -> inA == inM;
            };
            if (!ok) {
                wrong.add(e.getKey() + " " + e.getValue() + " in A " + inA + " in B " + inM);
            }
        }
        assertEquals(List.of(), wrong);
        assertEquals(total, Bank.balance(pgA) + Bank.balance(maria), "the money adds up");
    }

    static Result transfer(DecreeTransactionManager tm, DecreeDataSource a, DecreeDataSource m, String id) {
        try {
            tm.begin();
        } catch (Exception e) {
            sleep(50); // the server is down: try again
            return Result.NOT_BEGUN;
        }
        try {
            Bank.transfer(a, m, id, 1);
        } catch (Exception e) {
            try {
                if (tm.getStatus() != Status.STATUS_NO_TRANSACTION) {
                    tm.rollback();
                }
            } catch (Exception ignored) {
                // rolled back by the server's presumed abort at worst
            }
            return Result.ROLLED_BACK;
        }
        try {
            tm.commit();
            return Result.COMMITTED;
        } catch (RollbackException e) {
            return Result.ROLLED_BACK;
        } catch (Exception e) {
            return Result.UNKNOWN;
        }
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
