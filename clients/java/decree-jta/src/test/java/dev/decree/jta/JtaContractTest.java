package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.HeuristicMixedException;
import jakarta.transaction.HeuristicRollbackException;
import jakarta.transaction.InvalidTransactionException;
import jakarta.transaction.NotSupportedException;
import jakarta.transaction.RollbackException;
import jakarta.transaction.Status;
import jakarta.transaction.Synchronization;
import jakarta.transaction.SystemException;
import jakarta.transaction.Transaction;
import jakarta.transaction.TransactionSynchronizationRegistry;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import javax.transaction.xa.XAException;
import javax.transaction.xa.XAResource;
import javax.transaction.xa.Xid;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.AutoClose;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The JTA contract against a real {@code decree serve} with dummy resource managers: every
 * state transition and its exception, as jakarta.transaction 2.0 states them, and what
 * reaches the server (docs/protocol.md, "What a client does").
 */
class JtaContractTest {
    @AutoClose
    static DecreeServer server;
    DecreeTransactionManager tm;
    List<String> journal;
    /** What the synchronizations ({@link Recorder}) of a test were told. */
    List<String> events;

    @BeforeAll
    static void startServer() throws Exception {
        server = DecreeServer.dummy("d1", "d2", "d3").start();
    }

    @BeforeEach
    void connect() throws Exception {
        tm = DecreeTransactionManager.connect(server.endpoint());
        tm.setOutcomeTimeoutMillis(10_000);
        tm.setParallelBranchCalls(false); // the journals below list the calls in their order (the parallel ones say so).
        journal = FakeResource.journal();
        events = Collections.synchronizedList(new ArrayList<>());
    }

    @AfterEach
    void close() {
        tm.close();
    }

    void enlist(XAResource... resources) throws Exception {
        FakeResource.enlist(tm, resources);
    }

    /** Enlists a branch on d1, then one on d2 set up by {@code second}: the d2 resource. */
    FakeResource enlistTwo(Consumer<FakeResource> second) throws Exception {
        FakeResource b = res("d2");
        second.accept(b);
        enlist(res("d1"), b);
        return b;
    }

    /** Begins a transaction that times out after a second (the next ones would not). */
    void beginTimingOut() throws Exception {
        tm.setTransactionTimeout(1);
        tm.begin();
        tm.setTransactionTimeout(0);
    }

    FakeResource res(String rm) {
        return new FakeResource(rm, journal);
    }

    DecreeXid current() {
        return ((DecreeTransaction) tm.getTransaction()).xid();
    }

    /** Outcome of {@code xid} once the server has a final answer (in progress is asked again). */
    Outcome settled(DecreeXid xid) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
        while (true) {
            Outcome o = tm.outcome(xid);
            if (o != Outcome.IN_PROGRESS || System.nanoTime() > deadline) {
                return o;
            }
            Thread.sleep(50);
        }
    }

    /** The metric once it reached {@code expected} (the server reads a notice after the client wrote it), or after 5 s. */
    static double awaitMetric(String name, double expected) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        double v = server.metric(name);
        while (v < expected && System.nanoTime() < deadline) {
            Thread.sleep(20);
            v = server.metric(name);
        }
        return v;
    }

    // --- without a transaction ---------------------------------------------------------------

    @Test
    void withoutATransactionEveryCallThatNeedsOneIsRefused() throws Exception {
        assertEquals(Status.STATUS_NO_TRANSACTION, tm.getStatus());
        assertNull(tm.getTransaction());
        assertThrows(IllegalStateException.class, tm::commit);
        assertThrows(IllegalStateException.class, tm::rollback);
        assertThrows(IllegalStateException.class, tm::setRollbackOnly);
        assertNull(tm.suspend());
        TransactionSynchronizationRegistry reg = tm.getSynchronizationRegistry();
        assertEquals(Status.STATUS_NO_TRANSACTION, reg.getTransactionStatus());
        assertNull(reg.getTransactionKey());
        assertThrows(IllegalStateException.class, () -> reg.putResource("k", "v"));
        assertThrows(IllegalStateException.class, () -> reg.registerInterposedSynchronization(new Recorder("i", new ArrayList<>())));
        assertThrows(IllegalStateException.class, reg::getRollbackOnly);
        assertThrows(SystemException.class, () -> tm.setTransactionTimeout(-1));
    }

    @Test
    void beginTwiceIsNotSupportedAndTheFirstTransactionStays() throws Exception {
        tm.begin();
        Transaction first = tm.getTransaction();
        assertThrows(NotSupportedException.class, tm::begin);
        assertSame(first, tm.getTransaction());
        tm.rollback();
        assertEquals(Status.STATUS_NO_TRANSACTION, tm.getStatus());
    }

    // --- commits -----------------------------------------------------------------------------

    @Test
    void aTransactionWithoutBranchesCommitsAndSendsNothing() throws Exception {
        double before = server.metric("decree_commits_total");
        tm.begin();
        assertEquals(Status.STATUS_ACTIVE, tm.getStatus());
        tm.commit();
        assertEquals(Status.STATUS_NO_TRANSACTION, tm.getStatus());
        assertEquals(before, server.metric("decree_commits_total"));
    }

    @Test
    void oneBranchCommitsInOnePhaseAfterTheOnePhaseNoticeAndTheServerRemembersIt() throws Exception {
        double notices = server.metric("decree_one_phase_notices_total");
        double commits = server.metric("decree_commits_total");
        tm.begin();
        DecreeXid xid = current();
        tm.getTransaction().enlistResource(res("d1"));
        tm.commit();
        assertEquals(List.of("start 0", "end 0", "commit 0 1p"), journal);
        assertEquals(notices + 1, awaitMetric("decree_one_phase_notices_total", notices + 1), "the OnePhase notice reached the server");
        assertEquals(commits, server.metric("decree_commits_total"), "no Decide for one branch");
        assertEquals(Outcome.COMMITTED, tm.outcome(xid), "the Complete after OnePhase is remembered as a commit");
    }

    @Test
    void twoBranchesArePreparedDecidedCommittedAndCompleted() throws Exception {
        double commits = server.metric("decree_commits_total");
        tm.begin();
        DecreeXid xid = current();
        FakeResource a = res("d1");
        FakeResource b = res("d2");
        assertTrue(tm.getTransaction().enlistResource(a));
        assertTrue(tm.getTransaction().enlistResource(b));
        assertTrue(tm.getTransaction().enlistResource(a), "enlisting the same resource again is the same branch");
        tm.commit();
        assertEquals(FakeResource.TWO_PHASE_COMMIT, journal);
        assertEquals(commits + 1, server.metric("decree_commits_total"));
        assertEquals(Outcome.COMMITTED, tm.outcome(xid));
        // The branch Xids are decree's: format id, gtrid node|incarnation|session|sequence, bqual = branch number.
        DecreeXid branch = DecreeXid.copyOf(a.xids.get(0));
        assertEquals(DecreeXid.FORMAT_ID, branch.getFormatId());
        assertEquals(server.node, branch.node());
        assertEquals(xid.branch(0), branch);
        assertEquals(xid.branch(1), DecreeXid.copyOf(b.xids.get(0)));
    }

    @Test
    void aSecondResourceOfTheSameDatabaseIsASecondBranchNeverAJoin() throws Exception {
        tm.begin();
        FakeResource a = res("d1");
        FakeResource a2 = res("d1");
        enlist(a, a2);
        tm.commit();
        assertEquals(FakeResource.TWO_PHASE_COMMIT, journal);
    }

    @Test
    void readOnlyVotesLeavePhaseTwoAndTheDecisionNamesOnlyTheOthers() throws Exception {
        double commits = server.metric("decree_commits_total");
        tm.begin();
        FakeResource ro = res("d1");
        ro.vote = XAResource.XA_RDONLY;
        enlist(ro, res("d2"), res("d3"));
        tm.commit();
        assertEquals(List.of("start 0", "start 1", "start 2", "end 0", "end 1", "end 2", "prepare 0", "prepare 1", "prepare 2",
                "commit 1", "commit 2"), journal);
        assertEquals(commits + 1, server.metric("decree_commits_total"));

        journal.clear();
        tm.begin();
        for (String rm : List.of("d1", "d2")) {
            FakeResource r = res(rm);
            r.vote = XAResource.XA_RDONLY;
            tm.getTransaction().enlistResource(r);
        }
        tm.commit();
        assertEquals(commits + 1, server.metric("decree_commits_total"), "every branch read-only: nothing to decide");
        assertFalse(journal.stream().anyMatch(s -> s.startsWith("commit")));
    }

    @Test
    void aBranchThatDoesNotPrepareRollsEveryBranchBackAndNothingIsDecided() throws Exception {
        double commits = server.metric("decree_commits_total");
        tm.begin();
        FakeResource a = res("d1");
        FakeResource b = res("d2");
        b.failPrepare = XAException.XA_RBINTEGRITY;
        enlist(a, b);
        RollbackException e = assertThrows(RollbackException.class, tm::commit);
        assertTrue(e.getMessage().contains("branch 1 on d2 did not prepare"), e.getMessage());
        assertEquals(List.of("start 0", "start 1", "end 0", "end 1", "prepare 0", "prepare 1", "rollback 0"), journal);
        assertEquals(commits, server.metric("decree_commits_total"));
        assertEquals(Status.STATUS_NO_TRANSACTION, tm.getStatus());
    }

    @Test
    void aBranchWhosePrepareLostItsAnswerIsRolledBackToo() throws Exception {
        tm.begin();
        FakeResource a = res("d1");
        FakeResource b = res("d2");
        b.failPrepare = XAException.XAER_RMFAIL;
        enlist(a, b);
        assertThrows(RollbackException.class, tm::commit);
        assertEquals(List.of("start 0", "start 1", "end 0", "end 1", "prepare 0", "prepare 1", "rollback 0", "rollback 1"), journal);
    }

    @Test
    void aDecisionNamingAResourceManagerTheServerLacksIsRefusedAndRolledBack() throws Exception {
        tm.begin();
        enlist(res("d1"), res("no-such-rm"));
        RollbackException e = assertThrows(RollbackException.class, tm::commit);
        assertTrue(e.getMessage().contains("no-such-rm"), e.getMessage());
        assertTrue(journal.containsAll(List.of("rollback 0", "rollback 1")), journal.toString());
        // The session stays usable (error 11 keeps the connection open).
        tm.begin();
        enlist(res("d1"), res("d2"));
        tm.commit();
    }

    @Test
    void parallelBranchCallsPrepareAndCommitEveryBranchOnTheirOwnThreads() throws Exception {
        tm.setParallelBranchCalls(true);
        List<String> threads = Collections.synchronizedList(new ArrayList<>());
        tm.begin();
        DecreeXid xid = current();
        for (String rm : List.of("d1", "d2", "d3")) {
            FakeResource r = res(rm);
            r.onPrepare = () -> threads.add(Thread.currentThread().getName());
            tm.getTransaction().enlistResource(r);
        }
        tm.commit();
        assertEquals(Outcome.COMMITTED, tm.outcome(xid));
        List<String> sorted = new ArrayList<>(journal);
        Collections.sort(sorted);
        assertEquals(List.of("commit 0", "commit 1", "commit 2", "end 0", "end 1", "end 2", "prepare 0", "prepare 1", "prepare 2",
                "start 0", "start 1", "start 2"), sorted);
        assertEquals(Thread.currentThread().getName(), threads.stream().filter(t -> !t.startsWith("decree-jta-branch")).findFirst()
                .orElse(null), "the first branch on the committing thread");
        assertEquals(2, threads.stream().filter(t -> t.startsWith("decree-jta-branch")).count(), "the others on branch threads");
    }

    @Test
    void aParallelPrepareThatFailsRollsEveryOtherBranchBack() throws Exception {
        tm.setParallelBranchCalls(true);
        double commits = server.metric("decree_commits_total");
        tm.begin();
        FakeResource bad = res("d2");
        bad.failPrepare = XAException.XA_RBROLLBACK;
        enlist(res("d1"), bad, res("d3"));
        RollbackException e = assertThrows(RollbackException.class, tm::commit);
        assertTrue(e.getMessage().contains("branch 1 on d2 did not prepare"), e.getMessage());
        assertTrue(journal.containsAll(List.of("rollback 0", "rollback 2")), journal.toString());
        assertFalse(journal.contains("rollback 1"), "a branch that voted rollback is not rolled back again");
        assertFalse(journal.stream().anyMatch(x -> x.startsWith("commit")));
        assertEquals(commits, server.metric("decree_commits_total"));
    }

    @Test
    void branchCallsGoOneAfterTheOtherWhileMoreTransactionsCallTheirsThanTheMaxAllows() throws Exception {
        tm.setParallelBranchCalls(true);
        String me = Thread.currentThread().getName();
        // One other transaction is preparing: within a max of 2, this one's calls are parallel.
        List<String> within = prepareThreadsBesideAnother(2);
        assertEquals(1, within.stream().filter(me::equals).count(), within.toString());
        assertEquals(2, within.stream().filter(t -> t.startsWith("decree-jta-branch")).count(), within.toString());
        // Past a max of 1, every call runs on the committing thread, one after the other.
        assertEquals(List.of(me, me, me), prepareThreadsBesideAnother(1));
        // And the count went back to zero: alone, a transaction calls in parallel again.
        tm.setParallelBranchCallsMax(1);
        List<String> alone = Collections.synchronizedList(new ArrayList<>());
        tm.begin();
        enlist(recordingPrepare(alone, "d1"), recordingPrepare(alone, "d2"));
        tm.commit();
        assertEquals(1, alone.stream().filter(t -> t.startsWith("decree-jta-branch")).count(), alone.toString());
        assertThrows(IllegalArgumentException.class, () -> tm.setParallelBranchCallsMax(-1));
    }

    /**
     * With {@code max} set, commits a three-branch transaction on this thread while another
     * transaction is held in the prepare of its first branch; the threads this one's
     * prepares ran on. Both commit.
     */
    private List<String> prepareThreadsBesideAnother(int max) throws Exception {
        tm.setParallelBranchCallsMax(max);
        java.util.concurrent.CountDownLatch held = new java.util.concurrent.CountDownLatch(1);
        java.util.concurrent.CountDownLatch release = new java.util.concurrent.CountDownLatch(1);
        CompletableFuture<Void> other = CompletableFuture.runAsync(() -> {
            try {
                tm.begin();
                FakeResource first = res("d1");
                first.onPrepare = () -> {
                    held.countDown();
                    try {
                        assertTrue(release.await(10, TimeUnit.SECONDS), "never released");
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                    }
                };
                enlist(first, res("d2"));
                tm.commit();
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        });
        assertTrue(held.await(10, TimeUnit.SECONDS), "the other transaction never prepared");
        List<String> threads = Collections.synchronizedList(new ArrayList<>());
        try {
            tm.begin();
            enlist(recordingPrepare(threads, "d1"), recordingPrepare(threads, "d2"), recordingPrepare(threads, "d3"));
            tm.commit();
        } finally {
            release.countDown();
        }
        other.get(10, TimeUnit.SECONDS);
        return threads;
    }

    /** A resource on {@code rm} whose prepare adds the name of the thread it ran on to {@code threads}. */
    private FakeResource recordingPrepare(List<String> threads, String rm) {
        FakeResource r = res(rm);
        r.onPrepare = () -> threads.add(Thread.currentThread().getName());
        return r;
    }

    // --- rollback-only, rollback ---------------------------------------------------------------

    @Test
    void rollbackRollsEveryBranchBackAndTellsTheSynchronizations() throws Exception {
        tm.begin();
        tm.getTransaction().registerSynchronization(new Recorder("s", events));
        enlist(res("d1"), res("d2"));
        tm.rollback();
        assertEquals(List.of("start 0", "start 1", "end 0 fail", "end 1 fail", "rollback 0", "rollback 1"), journal);
        assertEquals(List.of("s after " + Status.STATUS_ROLLEDBACK), events, "no beforeCompletion on rollback");
        assertEquals(Status.STATUS_NO_TRANSACTION, tm.getStatus());
    }

    @Test
    void rollbackOnlyMakesCommitRollBackAndRefusesNewWork() throws Exception {
        tm.begin();
        Transaction tx = tm.getTransaction();
        tx.registerSynchronization(new Recorder("s", events));
        tx.enlistResource(res("d1"));
        tm.setRollbackOnly();
        assertEquals(Status.STATUS_MARKED_ROLLBACK, tm.getStatus());
        assertTrue(tm.getSynchronizationRegistry().getRollbackOnly());
        assertThrows(RollbackException.class, () -> tx.enlistResource(res("d2")));
        assertThrows(RollbackException.class, () -> tx.registerSynchronization(new Recorder("t", events)));
        assertThrows(RollbackException.class, tm::commit);
        assertEquals(List.of("start 0", "end 0 fail", "rollback 0"), journal);
        assertEquals(List.of("s after " + Status.STATUS_ROLLEDBACK), events);
        assertEquals(Status.STATUS_NO_TRANSACTION, tm.getStatus());
        assertThrows(IllegalStateException.class, tx::commit, "a transaction ends once");
    }

    // --- synchronizations ----------------------------------------------------------------------

    static final class Recorder implements Synchronization {
        final String name;
        final List<String> events;
        RuntimeException before;
        RuntimeException after;
        Runnable duringBefore;

        Recorder(String name, List<String> events) {
            this.name = name;
            this.events = events;
        }

        @Override
        public void beforeCompletion() {
            events.add(name + " before");
            if (duringBefore != null) {
                duringBefore.run();
            }
            if (before != null) {
                throw before;
            }
        }

        @Override
        public void afterCompletion(int status) {
            events.add(name + " after " + status);
            if (after != null) {
                throw after;
            }
        }
    }

    /** Begins a transaction with {@code synchronizations} registered, in this order. */
    void beginWith(Recorder... synchronizations) throws Exception {
        tm.begin();
        for (Recorder r : synchronizations) {
            tm.getTransaction().registerSynchronization(r);
        }
    }

    @Test
    void interposedSynchronizationsRunBeforeCompletionLastAndAfterCompletionFirst() throws Exception {
        TransactionSynchronizationRegistry reg = tm.getSynchronizationRegistry();
        tm.begin();
        Transaction tx = tm.getTransaction();
        Recorder s1 = new Recorder("s1", events);
        Recorder i1 = new Recorder("i1", events);
        reg.registerInterposedSynchronization(i1);
        tx.registerSynchronization(s1);
        // A synchronization may register others during beforeCompletion (JPA providers do).
        s1.duringBefore = () -> {
            try {
                tx.registerSynchronization(new Recorder("s2", events));
                reg.registerInterposedSynchronization(new Recorder("i2", events));
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        };
        reg.putResource("key", "value");
        assertEquals("value", reg.getResource("key"));
        assertEquals(current(), reg.getTransactionKey());
        tx.enlistResource(res("d1"));
        tx.enlistResource(res("d2"));
        tm.commit();
        int c = Status.STATUS_COMMITTED;
        assertEquals(List.of("s1 before", "s2 before", "i1 before", "i2 before", "i1 after " + c, "i2 after " + c, "s1 after " + c,
                "s2 after " + c), events);
    }

    @Test
    void aBeforeCompletionThatThrowsRollsBackAndCommitSaysWhy() throws Exception {
        Recorder bad = new Recorder("bad", events);
        bad.before = new IllegalStateException("flush failed");
        beginWith(bad, new Recorder("later", events));
        enlist(res("d1"), res("d2"));
        RollbackException e = assertThrows(RollbackException.class, tm::commit);
        assertInstanceOf(IllegalStateException.class, e.getCause());
        assertEquals(List.of("bad before", "bad after " + Status.STATUS_ROLLEDBACK, "later after " + Status.STATUS_ROLLEDBACK), events);
        assertEquals(List.of("start 0", "start 1", "end 0 fail", "end 1 fail", "rollback 0", "rollback 1"), journal);
    }

    @Test
    void anAfterCompletionThatThrowsChangesNothing() throws Exception {
        Recorder bad = new Recorder("bad", events);
        bad.after = new IllegalStateException("ignored");
        beginWith(bad, new Recorder("next", events));
        tm.getTransaction().enlistResource(res("d1"));
        tm.commit();
        assertEquals(List.of("bad before", "next before", "bad after 3", "next after 3"), events);
    }

    @Test
    void synchronizationsCannotBeRegisteredOnceTheTransactionEnded() throws Exception {
        tm.begin();
        Transaction tx = tm.getTransaction();
        tm.commit();
        assertThrows(IllegalStateException.class, () -> tx.registerSynchronization(new Recorder("x", new ArrayList<>())));
        assertThrows(IllegalStateException.class, () -> tx.enlistResource(res("d1")));
        assertEquals(Status.STATUS_COMMITTED, tx.getStatus());
    }

    // --- suspend and resume ------------------------------------------------------------------

    @Test
    void aSuspendedTransactionIsResumedAndCommittedOnAnotherThread() throws Exception {
        tm.begin();
        DecreeXid xid = current();
        enlist(res("d1"), res("d2"));
        Transaction tx = tm.suspend();
        assertEquals(Status.STATUS_NO_TRANSACTION, tm.getStatus());
        assertNull(tm.getTransaction());
        // This thread may run another transaction meanwhile.
        tm.begin();
        assertThrows(IllegalStateException.class, () -> tm.resume(tx), "a thread with a transaction cannot resume another");
        tm.rollback();
        CompletableFuture.runAsync(() -> {
            try {
                tm.resume(tx);
                assertSame(tx, tm.getTransaction());
                tm.commit();
                assertNull(tm.getTransaction());
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        }).get(20, TimeUnit.SECONDS);
        assertEquals(Status.STATUS_COMMITTED, tx.getStatus());
        assertEquals(Outcome.COMMITTED, tm.outcome(xid));
        assertThrows(InvalidTransactionException.class, () -> tm.resume(tx), "an ended transaction cannot be resumed");
        Transaction foreign = new Transaction() {
            public void commit() {}
            public boolean delistResource(XAResource r, int f) { return false; }
            public boolean enlistResource(XAResource r) { return false; }
            public int getStatus() { return 0; }
            public void registerSynchronization(Synchronization s) {}
            public void rollback() {}
            public void setRollbackOnly() {}
        };
        assertThrows(InvalidTransactionException.class, () -> tm.resume(foreign));
    }

    @Test
    void delistWithSuspendThenEnlistResumesTheSameBranch() throws Exception {
        tm.begin();
        Transaction tx = tm.getTransaction();
        FakeResource a = res("d1");
        tx.enlistResource(a);
        assertTrue(tx.delistResource(a, XAResource.TMSUSPEND));
        assertTrue(tx.enlistResource(a));
        assertTrue(tx.delistResource(a, XAResource.TMSUCCESS));
        assertTrue(tx.enlistResource(a));
        tx.enlistResource(res("d2"));
        tm.commit();
        assertEquals(List.of("start 0", "end 0 suspend", "start 0 resume", "end 0", "start 0 join", "start 1", "end 0", "end 1",
                "prepare 0", "prepare 1", "commit 0", "commit 1"), journal);
    }

    @Test
    void delistWithFailMarksTheTransactionForRollback() throws Exception {
        tm.begin();
        FakeResource a = res("d1");
        enlist(a);
        Transaction tx = tm.getTransaction();
        tx.delistResource(a, XAResource.TMFAIL);
        assertEquals(Status.STATUS_MARKED_ROLLBACK, tx.getStatus());
        assertThrows(RollbackException.class, tm::commit);
    }

    // --- timeouts ----------------------------------------------------------------------------

    @Test
    void aTransactionPastItsTimeoutIsRolledBackAndItsThreadToldSo() throws Exception {
        beginTimingOut();
        Transaction tx = tm.getTransaction();
        tx.registerSynchronization(new Recorder("s", events));
        tx.enlistResource(res("d1"));
        tx.enlistResource(res("d2"));
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (tm.getStatus() != Status.STATUS_ROLLEDBACK && System.nanoTime() < deadline) {
            Thread.sleep(20);
        }
        assertEquals(Status.STATUS_ROLLEDBACK, tm.getStatus(), "rolled back by the reaper while the thread slept");
        assertTrue(journal.containsAll(List.of("rollback 0", "rollback 1")), journal.toString());
        assertEquals(List.of("s after " + Status.STATUS_ROLLEDBACK), events);
        assertThrows(IllegalStateException.class, () -> tx.enlistResource(res("d3")), "no new work");
        RollbackException e = assertThrows(RollbackException.class, tm::commit);
        assertTrue(e.getMessage().contains("timed out"), e.getMessage());
        assertEquals(Status.STATUS_NO_TRANSACTION, tm.getStatus(), "the thread is free again");
        tm.begin();
        tm.rollback();
    }

    @Test
    void rollbackAfterTheTimeoutIsWhatTheThreadExpected() throws Exception {
        beginTimingOut();
        tm.getTransaction().enlistResource(res("d1"));
        Thread.sleep(1500);
        tm.rollback();
        assertEquals(Status.STATUS_NO_TRANSACTION, tm.getStatus());
    }

    @Test
    void aTimeoutDuringPrepareRollsBackBeforeTheDecisionIsSent() throws Exception {
        double commits = server.metric("decree_commits_total");
        beginTimingOut();
        FakeResource slow = enlistTwo(r -> r.onPrepare = () -> sleep(1500));
        RollbackException e = assertThrows(RollbackException.class, tm::commit);
        assertTrue(e.getMessage().contains("timed out"), e.getMessage());
        assertEquals(List.of("start 0", "start 1", "end 0", "end 1", "prepare 0", "prepare 1", "rollback 0", "rollback 1"), journal);
        assertEquals(commits, server.metric("decree_commits_total"));
    }

    @Test
    void aTimeoutAfterTheDecisionLetsTheThreadLearnTheRealOutcome() throws Exception {
        beginTimingOut();
        FakeResource slow = enlistTwo(r -> r.onCommit = () -> sleep(1500));
        tm.commit(); // decided before the timeout: committed, however long phase two takes.
        assertEquals(FakeResource.TWO_PHASE_COMMIT, journal);
    }

    /**
     * Every transaction schedules its timeout; one that ends first must take it off the
     * timer's queue, or the queue (and every transaction its timeouts hold) grows with the
     * transactions of the last timeout period instead of the live ones.
     */
    @Test
    void theTimeoutOfAnEndedTransactionLeavesTheTimersQueue() throws Exception {
        int before = tm.timer().getQueue().size(); // the keep-alive's task, if it runs.
        for (int i = 0; i < 50; i++) {
            tm.begin();
            assertEquals(before + 1, tm.timer().getQueue().size(), "the live transaction's timeout is queued");
            enlist(res("d1"), res("d2"));
            if (i % 2 == 0) {
                tm.commit();
            } else {
                tm.rollback();
            }
        }
        assertEquals(before, tm.timer().getQueue().size(), "no timeout of an ended transaction is left queued");
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    // --- heuristics and phase two --------------------------------------------------------------

    @Test
    void aBranchThatRolledBackOnItsOwnInPhaseTwoIsHeuristicMixedAndTheServerIsTold() throws Exception {
        tm.begin();
        DecreeXid xid = current();
        FakeResource b = enlistTwo(r -> r.failCommit = XAException.XA_HEURRB);
        assertThrows(HeuristicMixedException.class, tm::commit);
        assertTrue(journal.contains("forget 1"), journal.toString());
        assertEquals(Outcome.HEURISTIC, tm.outcome(xid), "CompleteHeuristic reached the server");
    }

    @Test
    void everyBranchRolledBackOnItsOwnIsHeuristicRollback() throws Exception {
        tm.begin();
        DecreeXid xid = current();
        for (String rm : List.of("d1", "d2")) {
            FakeResource r = res(rm);
            r.failCommit = XAException.XA_HEURRB;
            tm.getTransaction().enlistResource(r);
        }
        assertThrows(HeuristicRollbackException.class, tm::commit);
        assertEquals(Outcome.HEURISTIC, tm.outcome(xid));
    }

    @Test
    void aOnePhaseCommitThatRolledBackIsARollbackException() throws Exception {
        tm.begin();
        FakeResource a = res("d1");
        a.failCommit = XAException.XA_RBDEADLOCK;
        tm.getTransaction().enlistResource(a);
        assertThrows(RollbackException.class, tm::commit);
    }

    @Test
    void aOnePhaseCommitWhoseAnswerWasLostIsOutcomeUnknownAndTheServerSaysSo() throws Exception {
        tm.begin();
        DecreeXid xid = current();
        FakeResource a = res("d1");
        a.failCommit = XAException.XAER_RMFAIL;
        tm.getTransaction().enlistResource(a);
        OutcomeUnknownException e = assertThrows(OutcomeUnknownException.class, tm::commit);
        assertTrue(e.getMessage().contains("one-phase: only the database knows"), e.getMessage());
        assertEquals(xid, e.xid());
        assertInstanceOf(SystemException.class, e);
        assertEquals(Outcome.UNKNOWN, settled(xid), "the told server answers unknown once the session closed, never rolled back");
    }

    @Test
    void aBranchPhaseTwoCannotCommitIsLeftToTheServerAndTheTransactionIsCommitted() throws Exception {
        tm.begin();
        DecreeXid xid = current();
        FakeResource b = enlistTwo(r -> r.failCommit = XAException.XAER_RMFAIL);
        DecreeTransaction tx = (DecreeTransaction) tm.getTransaction();
        tm.commit();
        assertEquals(List.of("d2"), tx.phaseTwoPending());
        assertTrue(b.abandoned);
        assertEquals(Outcome.COMMITTED, settled(xid), "the server finishes the decided transaction of the closed session");
    }

    // --- what may be enlisted ----------------------------------------------------------------

    @Test
    void aResourceTheServerCannotFinishIsRefusedWithTheReason() throws Exception {
        tm.begin();
        XAResource plain = new FakeResource("d1", journal);
        XAResource anonymous = (XAResource) java.lang.reflect.Proxy.newProxyInstance(getClass().getClassLoader(),
                new Class<?>[] {XAResource.class}, (p, m, a) -> null);
        SystemException e = assertThrows(SystemException.class, () -> tm.getTransaction().enlistResource(anonymous));
        assertTrue(e.getMessage().contains("server could never finish its branch"), e.getMessage());
        assertTrue(tm.getTransaction().enlistResource(plain));
        tm.rollback();
        assertNotNull(DecreeResource.named(new FakeResource("x", journal), "d1"));
        assertThrows(IllegalArgumentException.class, () -> DecreeResource.named(new FakeResource("x", journal), ""));
    }

    // --- the session and the server ----------------------------------------------------------

    @Test
    void aDecisionTheSessionCouldNotSendRollsBack() throws Exception {
        try (DecreeServer own = DecreeServer.dummy("d1", "d2").start();
                DecreeTransactionManager local = DecreeTransactionManager.connect(own.endpoint())) {
            local.setParallelBranchCalls(false);
            local.begin();
            FakeResource a = res("d1");
            FakeResource b = res("d2");
            b.onPrepare = () -> {
                try {
                    own.kill();
                } catch (InterruptedException e) {
                    throw new IllegalStateException(e);
                }
            };
            FakeResource.enlist(local, a, b);
            RollbackException e = assertThrows(RollbackException.class, local::commit);
            assertTrue(e.getMessage().contains("decision was not sent"), e.getMessage());
            assertTrue(journal.containsAll(List.of("rollback 0", "rollback 1")), journal.toString());
        }
    }

    /**
     * A manager of {@code own} whose answers time out after 500 ms, that asks {@code Outcome}
     * for up to {@code outcomeTimeoutMs}, with a transaction begun.
     */
    static DecreeTransactionManager impatientIn(DecreeServer own, long outcomeTimeoutMs) throws Exception {
        DecreeTransactionManager m = new DecreeTransactionManager(Endpoint.parseList(own.endpoint()),
                SessionOptions.defaults().withReplyTimeoutMs(500));
        m.setOutcomeTimeoutMillis(outcomeTimeoutMs);
        m.setParallelBranchCalls(false);
        m.begin();
        return m;
    }

    interface Step {
        void run() throws Exception;
    }

    /** Stops {@code own} (SIGSTOP), and {@code ms} later, on another thread, runs {@code then}. */
    static Runnable stopFor(DecreeServer own, long ms, Step then) {
        return () -> {
            try {
                own.signal("STOP");
                CompletableFuture.runAsync(() -> {
                    sleep(ms);
                    try {
                        then.run();
                    } catch (Exception e) {
                        throw new IllegalStateException(e);
                    }
                });
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
        };
    }

    @Test
    void aLostAnswerToDecideIsResolvedWithOutcomeNeverGuessed() throws Exception {
        try (DecreeServer own = DecreeServer.dummy("d1", "d2").start();
                DecreeTransactionManager local = impatientIn(own, 20_000)) {
            FakeResource b = res("d2");
            // The server stops (SIGSTOP) before the decision arrives: the Decide waits in its
            // socket, the answer times out, the client closes the session and asks Outcome
            // until the server, continued, has read the decision and answers committed.
            b.onPrepare = stopFor(own, 1500, () -> own.signal("CONT"));
            FakeResource.enlist(local, res("d1"), b);
            local.commit();
            assertEquals(FakeResource.TWO_PHASE_COMMIT, journal);
        }
    }

    @Test
    void aDecisionLostWithTheServersProcessIsOutcomeUnknown() throws Exception {
        try (DecreeServer own = DecreeServer.dummy("d1", "d2").start();
                DecreeTransactionManager local = impatientIn(own, 15_000)) {
            FakeResource b = res("d2");
            // Stopped, then killed with the decision unread, then restarted: a new incarnation
            // cannot prove what an earlier one never read (rule 6.7: unknown).
            b.onPrepare = stopFor(own, 1000, () -> {
                own.kill();
                own.start();
            });
            FakeResource.enlist(local, res("d1"), b);
            OutcomeUnknownException e = assertThrows(OutcomeUnknownException.class, local::commit);
            assertTrue(e.getMessage().contains("cannot prove"), e.getMessage());
            assertFalse(journal.contains("commit 0") || journal.contains("rollback 0"), "no branch touched: " + journal);
        }
    }

    @Test
    void aWrongAddressFailsAtConnect() {
        SystemException e = assertThrows(SystemException.class, () -> DecreeTransactionManager.connect("unix:/nonexistent/decree.sock"));
        assertTrue(e.getMessage().contains("cannot connect"), e.getMessage());
    }

    @Test
    void threadsShareThePoolEachTransactionOnItsOwnSession() throws Exception {
        List<CompletableFuture<Void>> all = new ArrayList<>();
        for (int t = 0; t < 8; t++) {
            all.add(CompletableFuture.runAsync(() -> {
                try {
                    for (int i = 0; i < 20; i++) {
                        tm.begin();
                        enlist(new FakeResource("d1", FakeResource.journal()), new FakeResource("d2", FakeResource.journal()));
                        tm.commit();
                    }
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            }));
        }
        for (CompletableFuture<Void> f : all) {
            f.get(60, TimeUnit.SECONDS);
        }
    }

    @Test
    void branchXidsAreDecreesAndNamedByNumber() {
        Xid x = DecreeXid.of(5, 6, 7, 8).branch(2);
        assertEquals(2, DecreeXid.copyOf(x).branchNumber());
    }
}
