package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.HeuristicMixedException;
import jakarta.transaction.HeuristicRollbackException;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.TimeUnit;
import javax.transaction.xa.XAException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.AutoClose;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/**
 * Issue 32 against a real {@code decree serve}: a heuristic branch is forgotten ({@code XA
 * FORGET}) only once the server has answered the kept-reply field of {@code CompleteHeuristic}
 * with {@code OutcomeIs} heuristic, never before it has the report, and never when it says
 * NotKept, does not know the field (MustUnderstand) or speaks version 2 ({@link KeptProxy}
 * plays those servers in front of the real one). Each forget asks a second manager what the
 * server answers for the transaction at that moment: heuristic, or the report was not kept.
 */
class HeuristicKeptTest {
    @AutoClose
    static DecreeServer server;
    DecreeTransactionManager tm;
    DecreeTransactionManager observer;
    List<String> journal;
    /** What the server answered for the transaction at each forget. */
    List<Outcome> atForget;

    @BeforeAll
    static void startServer() throws Exception {
        server = DecreeServer.dummy("d1", "d2").start();
    }

    @BeforeEach
    void connect() throws Exception {
        tm = manager(server.endpoint());
        observer = DecreeTransactionManager.connect(server.endpoint());
        journal = FakeResource.journal();
        atForget = Collections.synchronizedList(new ArrayList<>());
    }

    @AfterEach
    void close() {
        tm.close();
        observer.close();
    }

    static DecreeTransactionManager manager(String endpoint) throws Exception {
        DecreeTransactionManager m = DecreeTransactionManager.connect(endpoint);
        m.setOutcomeTimeoutMillis(10_000);
        m.setParallelBranchCalls(false);
        return m;
    }

    /** A resource of {@code rm} whose forget records what the server says of {@code xid} then. */
    FakeResource res(String rm, DecreeXid[] xid) {
        FakeResource r = new FakeResource(rm, journal);
        r.onForget = () -> {
            try {
                atForget.add(observer.outcome(xid[0]));
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        };
        return r;
    }

    /** Begins a transaction in {@code m}; {@code xid[0]} is its Xid. */
    static DecreeXid[] begin(DecreeTransactionManager m) throws Exception {
        m.begin();
        return new DecreeXid[] {((DecreeTransaction) m.getTransaction()).xid()};
    }

    /** Outcome of {@code xid} once the server has a final answer (in progress is asked again). */
    Outcome settled(DecreeXid xid) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
        while (true) {
            Outcome o = observer.outcome(xid);
            if (o != Outcome.IN_PROGRESS || System.nanoTime() > deadline) {
                return o;
            }
            Thread.sleep(50);
        }
    }

    // --- a version-3 server that keeps the report ----------------------------------------------

    @Test
    void phaseTwoForgetsAHeuristicBranchOnlyOnceTheServerKeepsItsReport() throws Exception {
        DecreeXid[] xid = begin(tm);
        FakeResource b = res("d2", xid);
        b.failCommit = XAException.XA_HEURRB;
        FakeResource.enlist(tm, res("d1", xid), b);
        assertThrows(HeuristicMixedException.class, tm::commit);
        assertEquals(List.of("forget 1"), journal.stream().filter(s -> s.startsWith("forget")).toList(), journal.toString());
        assertEquals(List.of(Outcome.HEURISTIC), atForget, "the server had kept the report when the branch was forgotten");
    }

    @Test
    void aRollbackForgetsABranchThatCommittedOnItsOwnOnlyOnceTheServerKeepsItsReport() throws Exception {
        DecreeXid[] xid = begin(tm);
        FakeResource b = res("d2", xid);
        b.failRollback = XAException.XA_HEURCOM;
        FakeResource.enlist(tm, res("d1", xid), b);
        tm.rollback();
        assertTrue(journal.contains("forget 1"), journal.toString());
        assertEquals(List.of(Outcome.HEURISTIC), atForget);
        assertEquals(Outcome.HEURISTIC, observer.outcome(xid[0]));
    }

    @Test
    void aOnePhaseCommitRolledBackOnItsOwnIsReportedAndForgottenOnceKept() throws Exception {
        DecreeXid[] xid = begin(tm);
        FakeResource a = res("d1", xid);
        a.failCommit = XAException.XA_HEURRB;
        FakeResource.enlist(tm, a);
        assertThrows(HeuristicRollbackException.class, tm::commit);
        assertTrue(journal.contains("forget 0"), journal.toString());
        assertEquals(List.of(Outcome.HEURISTIC), atForget, "the told server answers heuristic, never unknown");
        assertEquals(Outcome.HEURISTIC, settled(xid[0]));
    }

    @Test
    void aOnePhaseCommitCompletedInPartOnItsOwnIsReportedAndForgottenOnceKept() throws Exception {
        DecreeXid[] xid = begin(tm);
        FakeResource a = res("d1", xid);
        a.failCommit = XAException.XA_HEURMIX;
        FakeResource.enlist(tm, a);
        assertThrows(HeuristicMixedException.class, tm::commit);
        assertEquals(List.of(Outcome.HEURISTIC), atForget);
        assertEquals(Outcome.HEURISTIC, settled(xid[0]));
    }

    @Test
    void aOnePhaseCommitThatCommittedOnItsOwnIsCommittedReportedAndForgottenOnceKept() throws Exception {
        DecreeXid[] xid = begin(tm);
        FakeResource a = res("d1", xid);
        a.failCommit = XAException.XA_HEURCOM;
        FakeResource.enlist(tm, a);
        tm.commit();
        assertTrue(journal.contains("forget 0"), journal.toString());
        assertEquals(List.of(Outcome.HEURISTIC), atForget, "the server answers heuristic, not committed");
        assertEquals(Outcome.HEURISTIC, settled(xid[0]));
    }

    // --- servers that do not keep it -------------------------------------------------------------

    @ParameterizedTest
    @EnumSource(value = KeptProxy.Mode.class, names = {"NOT_KEPT", "MUST_UNDERSTAND"})
    void phaseTwoNeverForgetsWhenTheServerDoesNotKeepTheReport(KeptProxy.Mode mode) throws Exception {
        try (KeptProxy proxy = new KeptProxy(server.socket, server.dir.resolve("kept-" + mode + ".sock"), mode);
                DecreeTransactionManager through = manager(proxy.endpoint())) {
            DecreeXid[] xid = begin(through);
            FakeResource b = res("d2", xid);
            b.failCommit = XAException.XA_HEURRB;
            FakeResource.enlist(through, res("d1", xid), b);
            assertThrows(HeuristicMixedException.class, through::commit);
            assertEquals(List.of("MIXED kept"), proxy.completeHeuristics);
            assertFalse(journal.stream().anyMatch(s -> s.startsWith("forget")), "left to the server's recovery: " + journal);
        }
    }

    @ParameterizedTest
    @EnumSource(value = KeptProxy.Mode.class, names = {"NOT_KEPT", "MUST_UNDERSTAND"})
    void aRollbackNeverForgetsWhenTheServerDoesNotKeepTheReport(KeptProxy.Mode mode) throws Exception {
        try (KeptProxy proxy = new KeptProxy(server.socket, server.dir.resolve("kept-rb-" + mode + ".sock"), mode);
                DecreeTransactionManager through = manager(proxy.endpoint())) {
            DecreeXid[] xid = begin(through);
            FakeResource b = res("d2", xid);
            b.failRollback = XAException.XA_HEURMIX;
            FakeResource.enlist(through, res("d1", xid), b);
            through.rollback();
            assertEquals(List.of("MIXED kept"), proxy.completeHeuristics);
            assertFalse(journal.stream().anyMatch(s -> s.startsWith("forget")), journal.toString());
        }
    }

    @ParameterizedTest
    @EnumSource(value = KeptProxy.Mode.class, names = {"NOT_KEPT", "MUST_UNDERSTAND"})
    void aOnePhaseCommitNeverForgetsWhenTheServerDoesNotKeepTheReport(KeptProxy.Mode mode) throws Exception {
        try (KeptProxy proxy = new KeptProxy(server.socket, server.dir.resolve("kept-1p-" + mode + ".sock"), mode);
                DecreeTransactionManager through = manager(proxy.endpoint())) {
            DecreeXid[] xid = begin(through);
            FakeResource a = res("d1", xid);
            a.failCommit = XAException.XA_HEURRB;
            FakeResource.enlist(through, a);
            assertThrows(HeuristicRollbackException.class, through::commit);
            assertEquals(List.of("ROLLED_BACK kept"), proxy.completeHeuristics);
            assertFalse(journal.stream().anyMatch(s -> s.startsWith("forget")), journal.toString());
        }
    }

    @Test
    void aVersion2SessionSendsThePlainReportAndNeverForgets() throws Exception {
        DecreeXid[] xid;
        try (KeptProxy proxy = new KeptProxy(server.socket, server.dir.resolve("kept-v2.sock"), KeptProxy.Mode.VERSION_2)) {
            try (DecreeTransactionManager through = manager(proxy.endpoint())) {
                xid = begin(through);
                FakeResource b = res("d2", xid);
                b.failCommit = XAException.XA_HEURRB;
                FakeResource.enlist(through, res("d1", xid), b);
                assertThrows(HeuristicMixedException.class, through::commit);
                FakeResource[] rb = {res("d1", xid), res("d2", xid)};
                rb[1].failRollback = XAException.XA_HEURCOM;
                begin(through);
                FakeResource.enlist(through, rb);
                through.rollback();
                FakeResource one = res("d1", xid);
                one.failCommit = XAException.XA_HEURRB;
                begin(through);
                FakeResource.enlist(through, one);
                assertThrows(HeuristicRollbackException.class, through::commit);
            } // closing sends the buffered reports (the proxy reads them a moment later).
            long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (proxy.completeHeuristics.size() < 2 && System.nanoTime() < deadline) {
                Thread.sleep(20);
            }
            assertEquals(List.of("MIXED", "MIXED"), proxy.completeHeuristics, "plain reports, no kept-reply field; none for the untold one-phase commit");
        }
        assertFalse(journal.stream().anyMatch(s -> s.startsWith("forget")), journal.toString());
        assertEquals(Outcome.HEURISTIC, settled(xid[0]), "the plain report reached the server");
    }
}
