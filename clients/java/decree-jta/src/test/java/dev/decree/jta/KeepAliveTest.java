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
        try (DecreeServer server = DecreeServer.dummyWith("[limits]\nidle_timeout_ms = 1000\n", "d1", "d2").start();
                DecreeTransactionManager tm = DecreeTransactionManager.connect(server.endpoint())) {
            tm.setParallelBranchCalls(false);
            List<String> journal = FakeResource.journal();
            tm.begin();
            DecreeXid xid = ((DecreeTransaction) tm.getTransaction()).xid();
            FakeResource.enlist(tm, new FakeResource("d1", journal), new FakeResource("d2", journal));
            Transaction tx = tm.suspend();
            Thread.sleep(3500); // three and a half idle bounds
            tm.resume(tx);
            tm.commit();
            assertEquals(FakeResource.TWO_PHASE_COMMIT, journal);
            assertEquals(Outcome.COMMITTED, tm.outcome(xid));
            Thread.sleep(2500); // the pooled session idles too
            tm.begin();
            FakeResource.enlist(tm, new FakeResource("d1", journal), new FakeResource("d2", journal));
            tm.commit();
        }
    }
}
