package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;

import jakarta.transaction.Transaction;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * A server that closes idle sessions ({@code idle_timeout_ms}, announced in HelloOk): the
 * manager pings every session nobody is using, so a suspended transaction's session (whose
 * Xids name it) outlives the bound and its decision is still taken.
 */
class KeepAliveTest {
    @Test
    void aSuspendedTransactionsSessionIsKeptAliveAndItsDecisionTaken() throws Exception {
        try (DecreeServer server = new DecreeServer(List.of(new DecreeServer.Rm("d1", "dummy", null),
                new DecreeServer.Rm("d2", "dummy", null)), "[limits]\nidle_timeout_ms = 1000\n").start();
                DecreeTransactionManager tm = DecreeTransactionManager.connect(server.endpoint())) {
            tm.setParallelBranchCalls(false);
            List<String> journal = FakeResource.journal();
            tm.begin();
            DecreeXid xid = ((DecreeTransaction) tm.getTransaction()).xid();
            tm.getTransaction().enlistResource(new FakeResource("d1", journal));
            tm.getTransaction().enlistResource(new FakeResource("d2", journal));
            Transaction tx = tm.suspend();
            Thread.sleep(3500); // three and a half idle bounds
            tm.resume(tx);
            tm.commit();
            assertEquals(List.of("start 0", "start 1", "end 0", "end 1", "prepare 0", "prepare 1", "commit 0", "commit 1"), journal);
            assertEquals(Outcome.COMMITTED, tm.outcome(xid));
            Thread.sleep(2500); // the pooled session idles too
            tm.begin();
            tm.getTransaction().enlistResource(new FakeResource("d1", journal));
            tm.getTransaction().enlistResource(new FakeResource("d2", journal));
            tm.commit();
        }
    }
}
