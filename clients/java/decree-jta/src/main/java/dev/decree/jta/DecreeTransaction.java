package dev.decree.jta;

import dev.decree.jta.DecreeException.LostReply;
import dev.decree.jta.DecreeException.NotSent;
import dev.decree.jta.DecreeException.ServerError;
import dev.decree.jta.Message.Branch;
import jakarta.transaction.HeuristicMixedException;
import jakarta.transaction.HeuristicRollbackException;
import jakarta.transaction.RollbackException;
import jakarta.transaction.Status;
import jakarta.transaction.Synchronization;
import jakarta.transaction.SystemException;
import jakarta.transaction.Transaction;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import javax.transaction.xa.XAException;
import javax.transaction.xa.XAResource;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One global transaction: its branches (one per enlisted {@link DecreeResource}, numbered 0,
 * 1, 2, ... in enlistment order), its synchronizations, and the commit of docs/protocol.md,
 * "What a client does": one branch commits in one phase (after the {@code OnePhase} notice on
 * a version-3 session, then {@code Complete}); two or more are prepared ({@code XA_RDONLY}
 * votes leave), decided on the server ({@code Decide}, after a check that the session is
 * still open), committed, and completed ({@code Complete}). A lost answer to the decision is
 * resolved with {@code Outcome} on a new session, never guessed.
 */
public final class DecreeTransaction implements Transaction {
    private static final Logger log = LoggerFactory.getLogger("dev.decree.jta");

    enum BranchState { ACTIVE, SUSPENDED, ENDED, PREPARED, READ_ONLY, IN_DOUBT, DONE, ROLLED_BACK }

    static final class Enlisted {
        final XAResource resource;
        final String rm;
        final int number;
        final DecreeXid xid;
        BranchState state = BranchState.ACTIVE;

        Enlisted(XAResource resource, String rm, int number, DecreeXid xid) {
            this.resource = resource;
            this.rm = rm;
            this.number = number;
            this.xid = xid;
        }
    }

    final DecreeTransactionManager tm;
    private final DecreeXid xid;
    private ServerSession session;
    private final List<Enlisted> branches = new ArrayList<>();
    private final List<Synchronization> synchronizations = new ArrayList<>();
    private final List<Synchronization> interposed = new ArrayList<>();
    private final Map<Object, Object> resources = new HashMap<>();
    private final Object lock = new Object();
    private int status = Status.STATUS_ACTIVE;
    /** Set once beforeCompletion of the interposed synchronizations started: no more of them. */
    private boolean interposedClosed;
    private boolean beforeCompletionRunning;
    private volatile boolean timedOut;
    private final long deadlineNanos;
    private final int timeoutSeconds;
    private ScheduledFuture<?> reaper;
    private Throwable rollbackCause;
    private boolean closeSession;
    private boolean ended;
    private final Map<Object, Object> bound = new HashMap<>();
    private final List<Runnable> onEnd = new ArrayList<>();

    DecreeTransaction(DecreeTransactionManager tm, ServerSession session, int timeoutSeconds) {
        this.tm = tm;
        this.session = session;
        this.xid = session.nextXid();
        this.timeoutSeconds = timeoutSeconds;
        this.deadlineNanos = timeoutSeconds > 0 ? System.nanoTime() + timeoutSeconds * 1_000_000_000L : Long.MAX_VALUE;
        if (timeoutSeconds > 0) {
            reaper = tm.timer().schedule(this::timeout, timeoutSeconds, TimeUnit.SECONDS);
        }
        log.debug("{}: begun", xid);
    }

    /** The global Xid of this transaction (what the server knows it by). */
    public DecreeXid xid() {
        return xid;
    }

    boolean finished() {
        synchronized (lock) {
            return ended;
        }
    }

    @Override
    public String toString() {
        return "DecreeTransaction " + xid + " (" + statusName(status) + ")";
    }

    static String statusName(int status) {
        return switch (status) {
            case Status.STATUS_ACTIVE -> "active";
            case Status.STATUS_MARKED_ROLLBACK -> "marked rollback";
            case Status.STATUS_PREPARED -> "prepared";
            case Status.STATUS_COMMITTED -> "committed";
            case Status.STATUS_ROLLEDBACK -> "rolled back";
            case Status.STATUS_UNKNOWN -> "unknown";
            case Status.STATUS_NO_TRANSACTION -> "no transaction";
            case Status.STATUS_PREPARING -> "preparing";
            case Status.STATUS_COMMITTING -> "committing";
            case Status.STATUS_ROLLING_BACK -> "rolling back";
            default -> "status " + status;
        };
    }

    @Override
    public int getStatus() {
        synchronized (lock) {
            return status;
        }
    }

    // --- timeouts ----------------------------------------------------------------------------

    /**
     * The reaper: a transaction still active (or marked) past its timeout is rolled back here
     * and its thread is told at its next call. Once the commit has begun, only the flag is
     * set: the committing thread rolls back if the decision was not sent yet, and otherwise
     * learns the real outcome.
     */
    private void timeout() {
        synchronized (lock) {
            timedOut = true;
            if (ended || (status != Status.STATUS_ACTIVE && status != Status.STATUS_MARKED_ROLLBACK) || beforeCompletionRunning) {
                return;
            }
            log.warn("{}: timed out after {} s; rolling back", xid, timeoutSeconds);
            rollbackCause = new IllegalStateException("the transaction timed out after " + timeoutSeconds + " s");
            status = Status.STATUS_ROLLING_BACK;
        }
        rollBackAll(false);
        finish(Status.STATUS_ROLLEDBACK);
    }

    private boolean pastDeadline() {
        return timedOut || System.nanoTime() - deadlineNanos > 0;
    }

    private RollbackException timedOutException() {
        RollbackException e = new RollbackException(xid + ": the transaction timed out after " + timeoutSeconds
                + " s and was rolled back");
        return e;
    }

    // --- enlisting ---------------------------------------------------------------------------

    private void checkActive(String call) throws RollbackException {
        synchronized (lock) {
            if (status == Status.STATUS_MARKED_ROLLBACK) {
                throw new RollbackException(call + ": " + xid + " is marked for rollback"
                        + (timedOut ? " (it timed out after " + timeoutSeconds + " s)" : ""));
            }
            if (status != Status.STATUS_ACTIVE || ended) {
                throw new IllegalStateException(call + ": " + xid + " is " + statusName(status)
                        + (timedOut && status == Status.STATUS_ROLLEDBACK ? " (it timed out after " + timeoutSeconds + " s)" : ""));
            }
        }
    }

    private Enlisted find(XAResource res) {
        for (Enlisted b : branches) {
            if (b.resource == res) {
                return b;
            }
        }
        return null;
    }

    /**
     * Makes {@code res} a branch of this transaction (a new branch number; never joined to
     * another resource's branch). The resource must be a {@link DecreeResource}: the server
     * could never finish the branch of any other.
     */
    @Override
    public boolean enlistResource(XAResource res) throws RollbackException, IllegalStateException, SystemException {
        if (res == null) {
            throw new IllegalStateException("enlistResource: null resource");
        }
        checkActive("enlistResource");
        synchronized (lock) {
            Enlisted b = find(res);
            if (b != null) {
                try {
                    if (b.state == BranchState.SUSPENDED) {
                        res.start(b.xid, XAResource.TMRESUME);
                        b.state = BranchState.ACTIVE;
                    } else if (b.state == BranchState.ENDED) {
                        res.start(b.xid, XAResource.TMJOIN); // the same resource (connection) only.
                        b.state = BranchState.ACTIVE;
                    }
                } catch (XAException e) {
                    throw DecreeTransactionManager.systemException(xid + ": " + b.rm + ": start (" + XaCodes.name(e) + ") failed", e);
                }
                return true;
            }
            if (!(res instanceof DecreeResource d)) {
                throw new SystemException("enlistResource: " + res.getClass().getName() + " is not a DecreeResource: it names no "
                        + "[[rm]] entry of the decree server, so the server could never finish its branch if this JVM died "
                        + "(a JMS session or a database the server cannot reach cannot take part). Take connections from a "
                        + "DecreeDataSource, or wrap a resource that stores decree's Xids with DecreeResource.named(resource, rm)");
            }
            if (branches.size() >= Protocol.BRANCHES_MAX) {
                throw new SystemException("enlistResource: a transaction has at most " + Protocol.BRANCHES_MAX + " branches");
            }
            int number = branches.size();
            Enlisted e = new Enlisted(res, d.rmName(), number, xid.branch(number));
            try {
                res.start(e.xid, XAResource.TMNOFLAGS);
            } catch (XAException ex) {
                throw DecreeTransactionManager.systemException(xid + ": " + e.rm + ": start of branch " + number + " failed ("
                        + XaCodes.name(ex) + ")", ex);
            }
            branches.add(e);
            log.debug("{}: branch {} on {}", xid, number, e.rm);
            return true;
        }
    }

    @Override
    public boolean delistResource(XAResource res, int flag) throws IllegalStateException, SystemException {
        synchronized (lock) {
            if (ended || (status != Status.STATUS_ACTIVE && status != Status.STATUS_MARKED_ROLLBACK)) {
                throw new IllegalStateException("delistResource: " + xid + " is " + statusName(status));
            }
            Enlisted b = find(res);
            if (b == null) {
                throw new IllegalStateException("delistResource: the resource is not enlisted in " + xid);
            }
            if (flag != XAResource.TMSUCCESS && flag != XAResource.TMFAIL && flag != XAResource.TMSUSPEND) {
                throw new IllegalArgumentException("delistResource: flag is TMSUCCESS, TMFAIL or TMSUSPEND");
            }
            if (b.state != BranchState.ACTIVE && !(b.state == BranchState.SUSPENDED && flag != XAResource.TMSUSPEND)) {
                return false;
            }
            try {
                res.end(b.xid, flag);
            } catch (XAException e) {
                status = Status.STATUS_MARKED_ROLLBACK;
                rollbackCause = e;
                b.state = BranchState.ENDED;
                return false;
            }
            b.state = flag == XAResource.TMSUSPEND ? BranchState.SUSPENDED : BranchState.ENDED;
            if (flag == XAResource.TMFAIL) {
                status = Status.STATUS_MARKED_ROLLBACK;
            }
            return true;
        }
    }

    void suspendResources() {
        // decree's own resources keep no per-thread state: nothing to end on suspend.
    }

    void resumeResources() {}

    // --- synchronizations --------------------------------------------------------------------

    @Override
    public void registerSynchronization(Synchronization sync) throws RollbackException, IllegalStateException, SystemException {
        if (sync == null) {
            throw new IllegalStateException("registerSynchronization: null synchronization");
        }
        synchronized (lock) {
            if (status == Status.STATUS_MARKED_ROLLBACK) {
                throw new RollbackException("registerSynchronization: " + xid + " is marked for rollback");
            }
            if (ended || (status != Status.STATUS_ACTIVE) || interposedClosed) {
                throw new IllegalStateException("registerSynchronization: " + xid + " is " + statusName(status));
            }
            synchronizations.add(sync);
        }
    }

    void registerInterposed(Synchronization sync) {
        synchronized (lock) {
            if (ended || (status != Status.STATUS_ACTIVE && status != Status.STATUS_MARKED_ROLLBACK) || interposedClosed) {
                throw new IllegalStateException("registerInterposedSynchronization: " + xid + " is " + statusName(status));
            }
            interposed.add(sync);
        }
    }

    Map<Object, Object> resourceMap() {
        return resources;
    }

    /** The library's own per-transaction state (a DecreeDataSource's connection), by key. */
    Object bound(Object key) {
        synchronized (lock) {
            return bound.get(key);
        }
    }

    /** Binds {@code value} to {@code key} for this transaction and runs {@code atEnd} once it ended (after afterCompletion). */
    void bind(Object key, Object value, Runnable atEnd) {
        synchronized (lock) {
            bound.put(key, value);
            onEnd.add(atEnd);
        }
    }

    /** Whether connections may still be enlisted: active, not past its end. */
    boolean acceptsWork() {
        synchronized (lock) {
            return !ended && (status == Status.STATUS_ACTIVE || status == Status.STATUS_MARKED_ROLLBACK);
        }
    }

    /** beforeCompletion of every synchronization, interposed ones last; the first failure marks the transaction. */
    private void beforeCompletion() {
        synchronized (lock) {
            beforeCompletionRunning = true;
        }
        try {
            for (int i = 0; i < synchronizations.size(); i++) {
                if (!callBefore(synchronizations.get(i))) {
                    return;
                }
            }
            synchronized (lock) {
                // A regular synchronization may still register an interposed one above; from here on, none.
            }
            for (int i = 0; i < interposed.size(); i++) {
                if (!callBefore(interposed.get(i))) {
                    return;
                }
            }
        } finally {
            synchronized (lock) {
                interposedClosed = true;
                beforeCompletionRunning = false;
            }
        }
    }

    private boolean callBefore(Synchronization s) {
        try {
            s.beforeCompletion();
            return true;
        } catch (RuntimeException | Error e) {
            log.warn("{}: beforeCompletion of {} failed; the transaction rolls back: {}", xid, s, e.toString());
            synchronized (lock) {
                status = Status.STATUS_MARKED_ROLLBACK;
                rollbackCause = e;
            }
            return false;
        }
    }

    private void afterCompletion(int outcome) {
        List<Synchronization> all = new ArrayList<>(interposed);
        all.addAll(synchronizations);
        for (Synchronization s : all) {
            try {
                s.afterCompletion(outcome);
            } catch (RuntimeException | Error e) {
                log.warn("{}: afterCompletion of {} failed (ignored): {}", xid, s, e.toString());
            }
        }
    }

    // --- ending ------------------------------------------------------------------------------

    @Override
    public void setRollbackOnly() throws IllegalStateException {
        synchronized (lock) {
            if (ended || status == Status.STATUS_ROLLEDBACK || status == Status.STATUS_COMMITTED) {
                throw new IllegalStateException("setRollbackOnly: " + xid + " is " + statusName(status));
            }
            if (status == Status.STATUS_ACTIVE) {
                status = Status.STATUS_MARKED_ROLLBACK;
            } else if (status != Status.STATUS_MARKED_ROLLBACK && status != Status.STATUS_ROLLING_BACK) {
                throw new IllegalStateException("setRollbackOnly: " + xid + " is " + statusName(status));
            }
        }
    }

    boolean rollbackOnly() {
        synchronized (lock) {
            return status == Status.STATUS_MARKED_ROLLBACK;
        }
    }

    /** Rolls every branch back; nothing is sent to the server (presumed abort). */
    @Override
    public void rollback() throws IllegalStateException, SystemException {
        synchronized (lock) {
            if (ended) {
                tm.disassociate(this);
                if (status == Status.STATUS_ROLLEDBACK && timedOut) {
                    return; // the reaper rolled it back: the thread's own rollback is what it expected.
                }
                throw new IllegalStateException("rollback: " + xid + " is " + statusName(status));
            }
            if (status != Status.STATUS_ACTIVE && status != Status.STATUS_MARKED_ROLLBACK) {
                throw new IllegalStateException("rollback: " + xid + " is " + statusName(status));
            }
            status = Status.STATUS_ROLLING_BACK;
        }
        endAll(XAResource.TMFAIL);
        rollBackAll(false);
        finish(Status.STATUS_ROLLEDBACK);
    }

    @Override
    public void commit() throws RollbackException, HeuristicMixedException, HeuristicRollbackException, SecurityException,
            IllegalStateException, SystemException {
        synchronized (lock) {
            if (ended) {
                tm.disassociate(this);
                if (status == Status.STATUS_ROLLEDBACK && timedOut) {
                    throw timedOutException();
                }
                throw new IllegalStateException("commit: " + xid + " is " + statusName(status));
            }
            if (status != Status.STATUS_ACTIVE && status != Status.STATUS_MARKED_ROLLBACK) {
                throw new IllegalStateException("commit: " + xid + " is " + statusName(status));
            }
        }
        if (status == Status.STATUS_ACTIVE && !pastDeadline()) {
            beforeCompletion();
        }
        synchronized (lock) {
            if (ended) { // the reaper rolled it back during beforeCompletion? It waits for it; but be safe.
                tm.disassociate(this);
                throw timedOutException();
            }
            if (status == Status.STATUS_MARKED_ROLLBACK || pastDeadline()) {
                boolean late = pastDeadline() && status != Status.STATUS_MARKED_ROLLBACK;
                Throwable cause = rollbackCause;
                status = Status.STATUS_ROLLING_BACK;
                endAll(XAResource.TMFAIL);
                rollBackAll(false);
                finish(Status.STATUS_ROLLEDBACK);
                RollbackException e = late || (timedOut && cause == null) ? timedOutException()
                        : new RollbackException(xid + ": marked for rollback" + (cause != null ? ": " + cause : "") + "; rolled back");
                if (cause != null) {
                    e.initCause(cause);
                }
                throw e;
            }
            status = Status.STATUS_PREPARING;
        }
        if (!endAll(XAResource.TMSUCCESS)) {
            rollBackAll(false);
            finish(Status.STATUS_ROLLEDBACK);
            RollbackException e = new RollbackException(xid + ": a branch failed to end; every branch is rolled back");
            e.initCause(rollbackCause);
            throw e;
        }
        try {
            int n = branches.size();
            if (n == 0) {
                finish(Status.STATUS_COMMITTED);
            } else if (n == 1) {
                onePhase(branches.get(0));
            } else {
                twoPhase();
            }
        } catch (RollbackException | HeuristicMixedException | HeuristicRollbackException | SystemException | RuntimeException | Error e) {
            if (!ended) {
                log.error("{}: unexpected failure during commit; the outcome is unknown", xid, e);
                abandonPrepared();
                closeSession = true;
                finish(Status.STATUS_UNKNOWN);
                throw new OutcomeUnknownException(xid + ": unexpected failure during commit: " + e, xid, e);
            }
            throw e;
        }
    }

    /** end() on every branch still associated; false when one failed (then the transaction rolls back). */
    private boolean endAll(int flag) {
        boolean ok = true;
        for (Enlisted b : branches) {
            if (b.state == BranchState.ACTIVE || b.state == BranchState.SUSPENDED) {
                try {
                    b.resource.end(b.xid, flag);
                } catch (XAException e) {
                    if (flag == XAResource.TMSUCCESS) {
                        log.warn("{}: end of branch {} on {} failed ({})", xid, b.number, b.rm, XaCodes.name(e));
                        rollbackCause = e;
                        ok = false;
                    }
                }
                b.state = BranchState.ENDED;
            }
        }
        return ok;
    }

    /** Ends the transaction: status, afterCompletion (interposed first), the session back or closed, the thread free. */
    private void finish(int outcome) {
        synchronized (lock) {
            if (ended) {
                return;
            }
            status = outcome;
            ended = true;
            if (reaper != null) {
                reaper.cancel(false);
            }
        }
        afterCompletion(outcome);
        List<Runnable> hooks;
        synchronized (lock) {
            hooks = new ArrayList<>(onEnd);
            onEnd.clear();
        }
        for (Runnable r : hooks) {
            try {
                r.run();
            } catch (RuntimeException e) {
                log.warn("{}: releasing a connection failed: {}", xid, e.toString());
            }
        }
        ServerSession s = session;
        session = null;
        if (s != null) {
            if (closeSession) {
                s.close();
            } else {
                tm.release(s);
            }
        }
        tm.disassociate(this);
    }

    private void onePhase(Enlisted b) throws RollbackException, HeuristicMixedException, HeuristicRollbackException, SystemException {
        boolean told;
        try {
            told = session.onePhase(xid);
        } catch (NotSent e) {
            closeSession = true;
            rollBackAll(false);
            finish(Status.STATUS_ROLLEDBACK);
            throw rolledBack(xid + ": the OnePhase notice could not be written (" + e.getMessage() + "); the branch on " + b.rm
                    + " is rolled back", e);
        }
        synchronized (lock) {
            status = Status.STATUS_COMMITTING;
        }
        try {
            b.resource.commit(b.xid, true);
        } catch (XAException e) {
            int code = e.errorCode;
            if (XaCodes.isRollback(code)) {
                b.state = BranchState.ROLLED_BACK;
                finish(Status.STATUS_ROLLEDBACK);
                throw rolledBack(xid + ": the one-phase commit on " + b.rm + " failed (" + XaCodes.name(e) + "); it is rolled back", e);
            }
            if (code == XAException.XA_HEURCOM || code == XAException.XA_HEURRB || code == XAException.XA_HEURMIX) {
                // A branch that decided on its own: a told server is told so and answers heuristic
                // for the Xid (never committed, nor unknown); the branch is forgotten only once the
                // server keeps that (issue 32). A server not told (version 2) has nothing to keep:
                // the branch stays for the server's recovery, never forgotten by this client.
                Heuristic heuristic = code == XAException.XA_HEURCOM ? Heuristic.COMMITTED
                        : code == XAException.XA_HEURRB ? Heuristic.ROLLED_BACK : Heuristic.MIXED;
                boolean kept = told && session.completeKept(xid, heuristic);
                forgetOnceKept(kept, List.of(b));
            }
            if (code == XAException.XA_HEURCOM) {
                b.state = BranchState.DONE;
                log.info("{}: committed; {} committed the branch on its own", xid, b.rm);
                finish(Status.STATUS_COMMITTED);
                return;
            } else if (code == XAException.XA_HEURRB) {
                b.state = BranchState.ROLLED_BACK;
                finish(Status.STATUS_ROLLEDBACK);
                HeuristicRollbackException h = new HeuristicRollbackException(xid + ": " + b.rm + " rolled the branch back on its own");
                h.initCause(e);
                throw h;
            } else if (code == XAException.XA_HEURMIX) {
                b.state = BranchState.DONE;
                finish(Status.STATUS_UNKNOWN);
                HeuristicMixedException h = new HeuristicMixedException(xid + ": " + b.rm + " completed the branch in part on its own");
                h.initCause(e);
                throw h;
            } else {
                // The answer was lost: only the database knows. A told server answers unknown
                // for the Xid once this session is closed (in progress before).
                b.state = BranchState.IN_DOUBT;
                String why = told ? "one-phase: only the database knows"
                        : "one-phase: only the database knows (the server speaks protocol version " + session.version
                                + " and was not told of this transaction)";
                closeSession = closeSession || told;
                finish(Status.STATUS_UNKNOWN);
                throw new OutcomeUnknownException(xid + ": " + why + "; the commit on " + b.rm + " lost its answer ("
                        + XaCodes.name(e) + ")", xid, e);
            }
        }
        b.state = BranchState.DONE;
        if (told) {
            session.complete(xid, null); // the server now remembers it committed (rule 8).
        }
        log.debug("{}: committed in one phase on {}", xid, b.rm);
        finish(Status.STATUS_COMMITTED);
    }

    private RollbackException rolledBack(String message, Throwable cause) {
        RollbackException e = new RollbackException(message);
        if (cause != null) {
            e.initCause(cause);
        }
        return e;
    }

    /** What one branch call did: its vote (prepare) and the exception it threw, if any. */
    private record CallResult(int vote, Exception error) {}

    interface BranchCall {
        int call(Enlisted b) throws XAException;
    }

    /**
     * Runs {@code call} on every branch of {@code list}: one after the other, or, when the
     * manager's parallel branch calls are on and few enough transactions call theirs now,
     * the first on this thread and the others at the same time on the manager's branch
     * threads (each branch is its own connection). Every
     * call has ended when this returns; one after the other, the calls stop at the first
     * error when {@code stopAtFirstError} says so (fewer results than branches).
     */
    private List<CallResult> callEach(List<Enlisted> list, BranchCall call, boolean stopAtFirstError) {
        if (list.size() < 2) {
            return callEach(list, call, stopAtFirstError, null);
        }
        java.util.concurrent.ExecutorService pool = tm.beginBranchCalls();
        try {
            return callEach(list, call, stopAtFirstError, pool);
        } finally {
            tm.endBranchCalls();
        }
    }

    /** {@link #callEach} on {@code pool}'s threads, or one after the other when it is null. */
    private List<CallResult> callEach(List<Enlisted> list, BranchCall call, boolean stopAtFirstError,
            java.util.concurrent.ExecutorService pool) {
        List<CallResult> out = new ArrayList<>();
        if (pool == null) {
            for (Enlisted b : list) {
                CallResult r = callOne(b, call);
                out.add(r);
                if (r.error() != null && stopAtFirstError) {
                    break; // the branches after it are not called (and stay unprepared).
                }
            }
            return out;
        }
        List<java.util.concurrent.Future<CallResult>> futures = new ArrayList<>();
        for (int i = 1; i < list.size(); i++) {
            Enlisted b = list.get(i);
            try {
                futures.add(pool.submit(() -> callOne(b, call)));
            } catch (java.util.concurrent.RejectedExecutionException e) {
                futures.add(java.util.concurrent.CompletableFuture.completedFuture(callOne(b, call))); // the manager is closing
            }
        }
        out.add(callOne(list.get(0), call));
        for (java.util.concurrent.Future<CallResult> f : futures) {
            boolean interrupted = false;
            while (true) {
                try {
                    out.add(f.get());
                    break;
                } catch (InterruptedException e) {
                    interrupted = true; // every call must end before the transaction goes on.
                } catch (java.util.concurrent.ExecutionException e) {
                    out.add(new CallResult(-1, new IllegalStateException(e.getCause())));
                    break;
                }
            }
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
        return out;
    }

    private static CallResult callOne(Enlisted b, BranchCall call) {
        try {
            return new CallResult(call.call(b), null);
        } catch (XAException | RuntimeException e) {
            return new CallResult(-1, e);
        }
    }

    private void twoPhase() throws RollbackException, HeuristicMixedException, HeuristicRollbackException, SystemException {
        List<CallResult> votes = callEach(branches, b -> b.resource.prepare(b.xid), true);
        Enlisted failed = null;
        Exception why = null;
        for (int i = 0; i < votes.size(); i++) {
            Enlisted b = branches.get(i);
            CallResult r = votes.get(i);
            if (r.error() == null) {
                b.state = r.vote() == XAResource.XA_RDONLY ? BranchState.READ_ONLY : BranchState.PREPARED;
            } else {
                b.state = r.error() instanceof XAException x && XaCodes.isRollback(x.errorCode) ? BranchState.ROLLED_BACK
                        : BranchState.IN_DOUBT;
                if (failed == null) {
                    failed = b;
                    why = r.error();
                }
            }
        }
        if (failed != null) {
            rollBackAll(false);
            finish(Status.STATUS_ROLLEDBACK);
            String reason = why instanceof XAException x ? XaCodes.name(x) : why.toString();
            throw rolledBack(xid + ": branch " + failed.number + " on " + failed.rm + " did not prepare (" + reason
                    + "); every branch is rolled back", why);
        }
        List<Branch> decision = new ArrayList<>();
        for (Enlisted b : branches) {
            if (b.state == BranchState.PREPARED) {
                decision.add(new Branch(b.number, b.rm));
            }
        }
        if (decision.isEmpty()) {
            log.debug("{}: every branch voted read-only; nothing to decide", xid);
            finish(Status.STATUS_COMMITTED);
            return;
        }
        if (pastDeadline()) {
            rollBackAll(false);
            finish(Status.STATUS_ROLLEDBACK);
            throw timedOutException();
        }
        synchronized (lock) {
            status = Status.STATUS_PREPARED;
        }
        Hooks.step("prepared", xid);
        try {
            session.decide(xid, decision);
        } catch (NotSent e) {
            // Never sent again elsewhere: the session is closed, so nothing decides it.
            closeSession = true;
            rollBackAll(false);
            finish(Status.STATUS_ROLLEDBACK);
            throw rolledBack(xid + ": the decision was not sent (" + e.getMessage() + "); every branch is rolled back", e);
        } catch (ServerError e) {
            if (e.code() == ErrorCodes.LOG_FAILED) {
                closeSession = true;
                abandonPrepared();
                finish(Status.STATUS_UNKNOWN);
                throw new OutcomeUnknownException(xid + ": the server's log failed while writing the decision; it may or may not "
                        + "be durable, and no branch is touched until the server restarts: " + e.serverMessage(), xid, e);
            }
            if (ErrorCodes.refusedBeforeWriting(e.code())) {
                rollBackAll(false);
                finish(Status.STATUS_ROLLEDBACK);
                throw rolledBack(xid + ": the server refused the decision, every branch is rolled back: " + e.getMessage(), e);
            }
            afterLostReply(e);
            return;
        } catch (LostReply e) {
            afterLostReply(e);
            return;
        }
        log.debug("{}: decided", xid);
        Hooks.step("decided", xid);
        synchronized (lock) {
            status = Status.STATUS_COMMITTING;
        }
        phaseTwo(true);
    }

    private void afterLostReply(DecreeException cause) throws RollbackException, HeuristicMixedException,
            HeuristicRollbackException, SystemException {
        // The old session must end for the server to answer; it is never used again.
        session.closeNow("the answer to Decide was lost: " + cause.getMessage());
        closeSession = true;
        Outcome answer = null;
        try {
            answer = tm.resolve(xid, cause, () -> {
                boolean any = false;
                for (Enlisted b : branches) {
                    if (b.resource instanceof DecreeResource d && d.holdsPrepared()) {
                        d.abandon();
                        any = true;
                    }
                }
                return any;
            });
        } catch (OutcomeUnknownException e) {
            abandonPrepared();
            finish(Status.STATUS_UNKNOWN);
            throw e;
        }
        switch (answer) {
            case COMMITTED -> {
                synchronized (lock) {
                    status = Status.STATUS_COMMITTING;
                }
                phaseTwo(false);
            }
            case ROLLED_BACK -> {
                rollBackAll(true);
                finish(Status.STATUS_ROLLEDBACK);
                throw rolledBack(xid + ": the answer to Decide was lost (" + cause.getMessage()
                        + "); the server says the transaction is rolled back", cause);
            }
            case HEURISTIC -> {
                abandonPrepared();
                finish(Status.STATUS_UNKNOWN);
                HeuristicMixedException h = new HeuristicMixedException(xid + ": the answer to Decide was lost ("
                        + cause.getMessage() + "); the server says a branch decided on its own: check the branches");
                h.initCause(cause);
                throw h;
            }
            default -> {
                abandonPrepared();
                finish(Status.STATUS_UNKNOWN);
                throw new OutcomeUnknownException(xid + ": the answer to Decide was lost (" + cause.getMessage()
                        + ") and the server cannot prove the outcome; its branches are left to the server (or to `decree recover`)",
                        xid, cause);
            }
        }
    }

    /** The branches that phase two could not commit (left to the server), after a commit. */
    private final List<String> pending = new ArrayList<>();

    /** RM names of branches phase two left to the server (the transaction is committed; the server commits them). */
    public List<String> phaseTwoPending() {
        return List.copyOf(pending);
    }

    private void phaseTwo(boolean sendComplete) throws HeuristicMixedException, HeuristicRollbackException {
        List<String> heuristics = new ArrayList<>();
        List<Enlisted> heuristicBranches = new ArrayList<>();
        boolean anyCommitted = false;
        boolean anyRolledBack = false;
        boolean anyHeuristicCommitted = false;
        List<Enlisted> prepared = new ArrayList<>();
        for (Enlisted b : branches) {
            if (b.state == BranchState.PREPARED) {
                prepared.add(b);
            }
        }
        List<CallResult> results = callEach(prepared, b -> {
            b.resource.commit(b.xid, false);
            return 0;
        }, false);
        for (int i = 0; i < prepared.size(); i++) {
            Enlisted b = prepared.get(i);
            Exception error = results.get(i).error();
            if (error == null) {
                b.state = BranchState.DONE;
                anyCommitted = true;
                Hooks.step("phase-two", xid);
            } else if (error instanceof XAException e) {
                int code = e.errorCode;
                if (code == XAException.XAER_NOTA) {
                    b.state = BranchState.DONE; // already committed (by an earlier attempt, or the server).
                    anyCommitted = true;
                } else if (code == XAException.XA_HEURCOM) {
                    b.state = BranchState.DONE;
                    anyCommitted = true;
                    anyHeuristicCommitted = true;
                    heuristics.add(b.rm + " committed on its own");
                    heuristicBranches.add(b);
                } else if (code == XAException.XA_HEURRB || XaCodes.isRollback(code)) {
                    b.state = BranchState.ROLLED_BACK;
                    anyRolledBack = true;
                    heuristics.add(b.rm + " rolled back on its own (" + XaCodes.name(e) + ")");
                    heuristicBranches.add(b);
                } else if (code == XAException.XA_HEURMIX) {
                    b.state = BranchState.DONE;
                    anyCommitted = true;
                    anyRolledBack = true;
                    heuristics.add(b.rm + " completed in part on its own");
                    heuristicBranches.add(b);
                } else {
                    log.warn("{}: phase two of branch {} on {} not done ({}); left to the server", xid, b.number, b.rm, XaCodes.name(e));
                    pending.add(b.rm);
                    if (b.resource instanceof DecreeResource d) {
                        d.abandon();
                    }
                }
            } else {
                log.warn("{}: phase two of branch {} on {} failed ({}); left to the server", xid, b.number, b.rm, error.toString());
                pending.add(b.rm);
                if (b.resource instanceof DecreeResource d) {
                    d.abandon();
                }
            }
        }
        Heuristic combined = null;
        if (!heuristics.isEmpty()) {
            combined = anyRolledBack ? (anyCommitted || !pending.isEmpty() ? Heuristic.MIXED : Heuristic.ROLLED_BACK)
                    : Heuristic.COMMITTED;
        }
        boolean kept = false;
        if (!pending.isEmpty()) {
            closeSession = true; // the server finishes phase two once this session is closed (rule 7), and finds the heuristic branches.
        } else if (sendComplete) {
            if (combined == null) {
                session.complete(xid, null);
            } else {
                kept = session.completeKept(xid, combined);
            }
        }
        forgetOnceKept(kept, heuristicBranches);
        if (combined == Heuristic.ROLLED_BACK) {
            finish(Status.STATUS_ROLLEDBACK);
            throw new HeuristicRollbackException(xid + ": decided to commit, but every branch rolled back on its own: "
                    + String.join("; ", heuristics));
        }
        if (combined == Heuristic.MIXED) {
            finish(Status.STATUS_UNKNOWN);
            throw new HeuristicMixedException(xid + ": committed, but branches decided on their own: " + String.join("; ", heuristics));
        }
        if (anyHeuristicCommitted) {
            log.info("{}: committed; branches committed on their own: {}", xid, heuristics);
        }
        finish(Status.STATUS_COMMITTED);
    }

    /**
     * Tells the resource managers of {@code heuristic} branches to forget them once the server
     * keeps the heuristic outcome ({@code kept}: its answer to the kept-reply field, issue 32).
     * Otherwise they stay, and the session is closed: the server's recovery finds them and
     * reports them again (forgetting first, a crash before the report reached the server lost
     * it everywhere). A version-2 session never keeps: its branches are never forgotten here.
     */
    private void forgetOnceKept(boolean kept, List<Enlisted> heuristic) {
        if (heuristic.isEmpty()) {
            return;
        }
        if (!kept) {
            if (session != null && session.version >= Protocol.TRAILER_VERSION) {
                closeSession = true; // hands the transaction to the server (rule 7), which reports the branches itself.
            }
            log.info("{}: {} heuristic branch(es) left for the server's recovery: the server did not say it keeps their outcome", xid,
                    heuristic.size());
            return;
        }
        for (Enlisted b : heuristic) {
            forget(b);
        }
    }

    private void forget(Enlisted b) {
        try {
            b.resource.forget(b.xid);
        } catch (XAException | RuntimeException e) {
            log.debug("{}: forget on {}: {}", xid, b.rm, e.toString());
        }
    }

    /** Leaves the prepared branches to the server, touching none (outcome unknown). */
    private void abandonPrepared() {
        for (Enlisted b : branches) {
            if (b.resource instanceof DecreeResource d) {
                d.abandon();
            }
        }
    }

    /**
     * Rolls back every branch; a rollback that cannot be confirmed closes the session, so that
     * the server's presumed abort rolls the branch back. A branch that decided on its own
     * during the rollback is reported to the server with CompleteHeuristic.
     */
    private void rollBackAll(boolean quiet) {
        Heuristic heuristic = null;
        List<Enlisted> heuristicBranches = new ArrayList<>();
        for (Enlisted b : branches) {
            if (b.state == BranchState.READ_ONLY || b.state == BranchState.ROLLED_BACK || b.state == BranchState.DONE) {
                continue;
            }
            if (b.state == BranchState.ACTIVE || b.state == BranchState.SUSPENDED) {
                try {
                    b.resource.end(b.xid, XAResource.TMFAIL);
                } catch (XAException | RuntimeException e) {
                    log.debug("{}: end(TMFAIL) of branch {} on {}: {}", xid, b.number, b.rm, e.toString());
                }
            }
            try {
                b.resource.rollback(b.xid);
                b.state = BranchState.ROLLED_BACK;
            } catch (XAException e) {
                int code = e.errorCode;
                if (code == XAException.XAER_NOTA || code == XAException.XA_HEURRB || XaCodes.isRollback(code)) {
                    b.state = BranchState.ROLLED_BACK;
                    if (code == XAException.XA_HEURRB) {
                        // Rolled back on its own: the outcome wanted, but a heuristic branch all the same,
                        // forgotten only once the server keeps its report (as decree-core does).
                        heuristic = Heuristic.ROLLED_BACK.combine(heuristic);
                        heuristicBranches.add(b);
                    }
                } else if (code == XAException.XA_HEURCOM || code == XAException.XA_HEURMIX) {
                    Heuristic h = code == XAException.XA_HEURCOM ? Heuristic.COMMITTED : Heuristic.MIXED;
                    heuristic = h.combine(heuristic);
                    log.error("{}: branch {} on {} {} on its own during the rollback", xid, b.number, b.rm,
                            code == XAException.XA_HEURCOM ? "committed" : "completed in part");
                    heuristicBranches.add(b);
                    b.state = BranchState.DONE;
                } else {
                    closeSession = true;
                    if (b.resource instanceof DecreeResource d) {
                        d.abandon();
                    }
                    if (quiet) {
                        log.debug("{}: rollback of branch {} on {} not confirmed ({}); the server rolls it back once this session is closed",
                                xid, b.number, b.rm, XaCodes.name(e));
                    } else {
                        log.warn("{}: rollback of branch {} on {} not confirmed ({}); the server rolls it back once this session is closed",
                                xid, b.number, b.rm, XaCodes.name(e));
                    }
                }
            } catch (RuntimeException e) {
                closeSession = true;
                log.warn("{}: rollback of branch {} on {} failed: {}", xid, b.number, b.rm, e.toString());
            }
        }
        boolean kept = false;
        if (heuristic != null && session != null && !closeSession) {
            kept = session.completeKept(xid, heuristic.combine(Heuristic.ROLLED_BACK));
        }
        forgetOnceKept(kept, heuristicBranches);
    }
}
