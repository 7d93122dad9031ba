package dev.decree.jta;

import dev.decree.jta.DecreeException.LostReply;
import dev.decree.jta.DecreeException.NotSent;
import dev.decree.jta.DecreeException.ServerError;
import dev.decree.jta.DecreeException.Unavailable;
import jakarta.transaction.HeuristicMixedException;
import jakarta.transaction.HeuristicRollbackException;
import jakarta.transaction.InvalidTransactionException;
import jakarta.transaction.NotSupportedException;
import jakarta.transaction.RollbackException;
import jakarta.transaction.Status;
import jakarta.transaction.SystemException;
import jakarta.transaction.Transaction;
import jakarta.transaction.TransactionManager;
import jakarta.transaction.TransactionSynchronizationRegistry;
import jakarta.transaction.UserTransaction;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.WeakHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A JTA {@link TransactionManager} (and {@link UserTransaction}) whose decisions live in a
 * decree state server. The coordinator runs here, on the application's threads and
 * connections; the server keeps the one durable record each two-phase commit needs and
 * finishes the branches of a JVM that died (docs/protocol.md, "What a client does").
 *
 * <pre>{@code
 * DecreeTransactionManager tm = DecreeTransactionManager.connect("unix:/run/decree/decree.sock");
 * tm.begin();
 * ... work on connections of DecreeDataSources (enlisted when taken) ...
 * tm.commit();
 * }</pre>
 *
 * <p>Each running transaction holds one server session from a pool shared by the threads of
 * the JVM (its Xids name that session), from {@code begin} to its end, suspended or not.
 * {@link #getSynchronizationRegistry()} gives the {@link TransactionSynchronizationRegistry}.
 */
public final class DecreeTransactionManager implements TransactionManager, UserTransaction, AutoCloseable {
    private static final Logger log = LoggerFactory.getLogger("dev.decree.jta");

    private final List<Endpoint> endpoints;
    private final SessionOptions options;
    private volatile int preferred;
    private final ArrayDeque<ServerSession> idle = new ArrayDeque<>();
    private final Map<ServerSession, Boolean> sessions = Collections.synchronizedMap(new WeakHashMap<>());
    private final ThreadLocal<DecreeTransaction> current = new ThreadLocal<>();
    private final ThreadLocal<Integer> timeoutSeconds = new ThreadLocal<>();
    private final ScheduledThreadPoolExecutor timer;
    private final SynchronizationRegistry registry = new SynchronizationRegistry(this);
    private volatile int defaultTimeoutSeconds = 60;
    private volatile long outcomeTimeoutMs = 30_000;
    private volatile boolean keepAliveStarted;
    private volatile java.util.concurrent.ExecutorService branchExecutor;
    private volatile int parallelCallsMax = Runtime.getRuntime().availableProcessors();
    /** Transactions of this manager calling their branches (prepare or commit) now. */
    private final java.util.concurrent.atomic.AtomicInteger callingBranches = new java.util.concurrent.atomic.AtomicInteger();
    private volatile boolean closed;

    public DecreeTransactionManager(List<Endpoint> endpoints, SessionOptions options) {
        if (endpoints.isEmpty()) {
            throw new IllegalArgumentException("no endpoint to connect to");
        }
        this.endpoints = List.copyOf(endpoints);
        this.options = options;
        this.timer = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "decree-jta-timer");
            t.setDaemon(true);
            return t;
        });
        // Every transaction schedules its timeout and cancels it when it ends: without this, a
        // cancelled timeout would stay queued (holding its transaction) until it was due, and
        // the queue would grow with the transactions of the last timeout, not the live ones.
        this.timer.setRemoveOnCancelPolicy(true);
        setParallelBranchCalls(true);
    }

    /**
     * A transaction manager on the server at {@code endpoint} ({@code unix:/path},
     * {@code tcp:host:port}, {@code tls:host:port}; a comma-separated list names the members
     * of a pair). Opens one session at once, so that a wrong address fails here.
     */
    public static DecreeTransactionManager connect(String endpoint) throws SystemException {
        return connect(endpoint, SessionOptions.defaults());
    }

    public static DecreeTransactionManager connect(String endpoint, SessionOptions options) throws SystemException {
        DecreeTransactionManager tm = new DecreeTransactionManager(Endpoint.parseList(endpoint), options);
        try {
            tm.release(tm.acquire());
        } catch (SystemException e) {
            tm.close();
            throw e;
        }
        return tm;
    }

    /** The timeout of transactions begun without {@link #setTransactionTimeout}, in seconds (60 by default; 0: none). */
    public void setDefaultTransactionTimeout(int seconds) {
        if (seconds < 0) {
            throw new IllegalArgumentException("a timeout is 0 or more seconds");
        }
        this.defaultTimeoutSeconds = seconds;
    }

    /** How long a lost answer to Decide is asked about with Outcome before it is reported unknown (30 s by default). */
    public void setOutcomeTimeoutMillis(long ms) {
        this.outcomeTimeoutMs = ms;
    }

    /**
     * Whether the branches of a transaction may be prepared, and committed, at the same time
     * (each branch is its own connection): one database round trip per phase instead of one
     * per branch, for a thread handoff per extra branch. On by default, while no more
     * transactions call their branches at once than {@link #setParallelBranchCallsMax}
     * allows; off, the calls of a transaction all run on its own thread, one branch after
     * the other, and a prepare that fails leaves the later branches unprepared.
     */
    public synchronized void setParallelBranchCalls(boolean on) {
        if (on && branchExecutor == null) {
            branchExecutor = Executors.newCachedThreadPool(r -> {
                Thread t = new Thread(r, "decree-jta-branch");
                t.setDaemon(true);
                return t;
            });
        } else if (!on && branchExecutor != null) {
            branchExecutor.shutdown();
            branchExecutor = null;
        }
    }

    /**
     * The most transactions calling their branches at once for which those calls still run
     * in parallel (default: the number of processors; 0: never); past it, each calls its
     * branches one after the other on its own thread. The handoff to a branch thread costs
     * CPU: it pays while cores are free (one thread committing: about twice the throughput),
     * not when every core is busy (16 threads on 2 cores: a third less; docs/measurements.md).
     */
    public void setParallelBranchCallsMax(int transactions) {
        if (transactions < 0) {
            throw new IllegalArgumentException("parallelBranchCallsMax is 0 or more transactions");
        }
        this.parallelCallsMax = transactions;
    }

    /**
     * Counts a transaction in while it calls its branches; the branch threads to call them
     * on, or null to call them one after the other (off, or too many transactions calling).
     * Every call is matched by one of {@link #endBranchCalls}.
     */
    java.util.concurrent.ExecutorService beginBranchCalls() {
        int calling = callingBranches.incrementAndGet();
        java.util.concurrent.ExecutorService pool = branchExecutor;
        return calling <= parallelCallsMax ? pool : null;
    }

    void endBranchCalls() {
        if (callingBranches.decrementAndGet() < 0) {
            throw new IllegalStateException("branch calls ended more often than begun");
        }
    }

    public TransactionSynchronizationRegistry getSynchronizationRegistry() {
        return registry;
    }

    // --- sessions ----------------------------------------------------------------------------

    /** The endpoint that served last (of a pair's members, the primary). */
    public Endpoint endpoint() {
        return endpoints.get(preferred % endpoints.size());
    }

    ServerSession open() throws SystemException {
        List<String> failures = new ArrayList<>();
        for (int i = 0; i < endpoints.size(); i++) {
            int index = (preferred + i) % endpoints.size();
            Endpoint ep = endpoints.get(index);
            try {
                ServerSession s = ServerSession.open(ep, options);
                preferred = index;
                sessions.put(s, Boolean.TRUE);
                if (s.idleTimeoutMs > 0) {
                    startKeepAlive(s.idleTimeoutMs);
                }
                return s;
            } catch (ServerError e) {
                if (e.code() != ErrorCodes.NOT_PRIMARY || endpoints.size() == 1) {
                    throw systemException(ep + ": the server refused the session: " + e.getMessage(), e);
                }
                failures.add(ep + ": " + e.getMessage());
            } catch (Unavailable e) {
                if (endpoints.size() == 1) {
                    throw systemException(e.getMessage(), e);
                }
                failures.add(e.getMessage());
            }
        }
        throw new SystemException("no member of the pair serves: " + String.join("; ", failures));
    }

    static SystemException systemException(String message, Throwable cause) {
        SystemException e = new SystemException(message);
        e.initCause(cause);
        return e;
    }

    ServerSession acquire() throws SystemException {
        if (closed) {
            throw new SystemException("this DecreeTransactionManager is closed");
        }
        while (true) {
            ServerSession s;
            synchronized (idle) {
                s = idle.pollLast();
            }
            if (s == null) {
                return open();
            }
            if (s.alive()) {
                return s;
            }
            s.close();
        }
    }

    void release(ServerSession s) {
        if (s.broken() || closed) {
            s.close();
            return;
        }
        synchronized (idle) {
            idle.addLast(s);
        }
    }

    private synchronized void startKeepAlive(long idleTimeoutMs) {
        if (keepAliveStarted) {
            return;
        }
        keepAliveStarted = true;
        // Every sixth of the server's idle bound, ping each session nobody is using that has
        // sent nothing for a third of it (docs/protocol.md, "Timeouts"): pooled ones and those
        // of suspended or prepared transactions alike.
        long period = Math.max(1, idleTimeoutMs / 6);
        timer.scheduleWithFixedDelay(() -> {
            List<ServerSession> all;
            synchronized (sessions) {
                all = new ArrayList<>(sessions.keySet());
            }
            for (ServerSession s : all) {
                s.pingIfIdle(idleTimeoutMs / 3);
            }
        }, period, period, TimeUnit.MILLISECONDS);
    }

    /** Asks the server what became of {@code xid} (session rule 6). */
    public Outcome outcome(DecreeXid xid) throws SystemException {
        ServerSession s = acquire();
        try {
            return s.outcome(xid);
        } catch (DecreeException e) {
            throw systemException(xid + ": Outcome failed: " + e.getMessage(), e);
        } finally {
            release(s);
        }
    }

    /**
     * The answer to a Decide whose reply was lost: Outcome on new sessions, asked again while
     * the server says in progress or cannot be reached, up to the outcome timeout. On a first
     * "unknown", {@code releaseAttached} lets go of branches the server cannot reach (MariaDB
     * branches attached to their connection) and the question is asked again.
     */
    Outcome resolve(DecreeXid xid, Exception cause, BooleanSupplier releaseAttached) throws OutcomeUnknownException {
        long deadline = System.nanoTime() + outcomeTimeoutMs * 1_000_000;
        long delay = 50;
        Exception last = cause;
        boolean released = false;
        while (true) {
            ServerSession s = null;
            try {
                s = open();
                Outcome answer = s.outcome(xid);
                log.info("{}: the answer to Decide was lost ({}); Outcome says {}", xid, cause.getMessage(), answer);
                if (answer == Outcome.UNKNOWN && !released && releaseAttached.getAsBoolean()) {
                    released = true;
                    log.info("{}: released the branches the server could not reach; asking again", xid);
                } else if (answer == Outcome.UNKNOWN && released && System.nanoTime() + delay * 1_000_000 <= deadline) {
                    // the server may still finish the released branches.
                } else if (answer != Outcome.IN_PROGRESS) {
                    return answer;
                }
            } catch (SystemException | DecreeException e) {
                log.info("{}: Outcome not answered yet: {}", xid, e.getMessage());
                last = e;
            } finally {
                if (s != null) {
                    release(s);
                }
            }
            if (System.nanoTime() + delay * 1_000_000 > deadline) {
                throw new OutcomeUnknownException(xid + ": the answer to Decide was lost (" + cause.getMessage()
                        + ") and the server gave no final answer within " + outcomeTimeoutMs + " ms (last: " + last.getMessage() + ")",
                        xid, cause);
            }
            try {
                Thread.sleep(delay);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new OutcomeUnknownException(xid + ": interrupted while asking the outcome", xid, e);
            }
            delay = Math.min(delay * 2, 1000);
        }
    }

    /** Closes the pooled sessions (buffered completions are sent first) and stops the timer. */
    @Override
    public void close() {
        closed = true;
        List<ServerSession> pool;
        synchronized (idle) {
            pool = new ArrayList<>(idle);
            idle.clear();
        }
        for (ServerSession s : pool) {
            s.close();
        }
        timer.shutdownNow();
        setParallelBranchCalls(false);
    }

    // --- thread association ------------------------------------------------------------------

    DecreeTransaction currentTransaction() {
        DecreeTransaction tx = current.get();
        if (tx != null && tx.finished()) {
            current.remove();
            return null;
        }
        return tx;
    }

    void disassociate(DecreeTransaction tx) {
        if (current.get() == tx) {
            current.remove();
        }
    }

    ScheduledThreadPoolExecutor timer() {
        return timer;
    }

    @Override
    public void begin() throws NotSupportedException, SystemException {
        DecreeTransaction old = current.get();
        if (old != null && old.finished()) {
            current.remove(); // timed out and rolled back by the reaper, never ended by its thread.
        } else if (old != null) {
            throw new NotSupportedException("this thread already has a transaction (nested transactions are not supported)");
        }
        Integer t = timeoutSeconds.get();
        int seconds = t == null ? defaultTimeoutSeconds : t;
        DecreeTransaction tx = new DecreeTransaction(this, acquire(), seconds);
        current.set(tx);
    }

    private DecreeTransaction required(String call) {
        DecreeTransaction tx = current.get(); // a timed-out one too: its thread learns it at commit.
        if (tx == null) {
            throw new IllegalStateException(call + ": this thread has no transaction");
        }
        return tx;
    }

    @Override
    public void commit() throws RollbackException, HeuristicMixedException, HeuristicRollbackException, SecurityException,
            IllegalStateException, SystemException {
        required("commit").commit();
    }

    @Override
    public void rollback() throws IllegalStateException, SecurityException, SystemException {
        required("rollback").rollback();
    }

    @Override
    public void setRollbackOnly() throws IllegalStateException, SystemException {
        required("setRollbackOnly").setRollbackOnly();
    }

    @Override
    public int getStatus() throws SystemException {
        DecreeTransaction tx = current.get();
        return tx == null ? Status.STATUS_NO_TRANSACTION : tx.getStatus();
    }

    @Override
    public Transaction getTransaction() {
        return current.get();
    }

    @Override
    public void setTransactionTimeout(int seconds) throws SystemException {
        if (seconds < 0) {
            throw new SystemException("a transaction timeout is 0 (the default) or more seconds, not " + seconds);
        }
        if (seconds == 0) {
            timeoutSeconds.remove();
        } else {
            timeoutSeconds.set(seconds);
        }
    }

    @Override
    public Transaction suspend() throws SystemException {
        DecreeTransaction tx = current.get();
        if (tx != null) {
            tx.suspendResources();
            current.remove();
        }
        return tx;
    }

    @Override
    public void resume(Transaction tobj) throws InvalidTransactionException, IllegalStateException, SystemException {
        if (currentTransaction() != null) {
            throw new IllegalStateException("resume: this thread already has a transaction");
        }
        if (tobj == null) {
            return;
        }
        if (!(tobj instanceof DecreeTransaction tx) || tx.tm != this) {
            throw new InvalidTransactionException("resume: " + tobj + " is not a transaction of this transaction manager");
        }
        if (tx.finished()) {
            throw new InvalidTransactionException("resume: " + tx + " has ended");
        }
        tx.resumeResources();
        current.set(tx);
    }
}
