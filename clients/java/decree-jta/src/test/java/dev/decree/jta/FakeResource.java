package dev.decree.jta;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import javax.transaction.xa.XAException;
import javax.transaction.xa.XAResource;
import javax.transaction.xa.Xid;

/**
 * A resource of the server's dummy kind that records every call ("start 0", "prepare 0",
 * "commit 0 1p", ...) in a shared journal and does what the test says: vote read-only, fail
 * prepare or commit with an XA code, or run a hook.
 */
final class FakeResource implements DecreeResource {
    final String rm;
    final List<String> journal;
    int vote = XA_OK;
    Integer failPrepare;
    Integer failCommit;
    Integer failRollback;
    Runnable onPrepare;
    Runnable onCommit;
    Runnable onForget;
    final List<Xid> xids = Collections.synchronizedList(new ArrayList<>());
    boolean abandoned;

    FakeResource(String rm, List<String> journal) {
        this.rm = rm;
        this.journal = journal;
    }

    static List<String> journal() {
        return Collections.synchronizedList(new ArrayList<>());
    }

    /** The journal of a commit of two branches, one after the other. */
    static final List<String> TWO_PHASE_COMMIT = List.of("start 0", "start 1", "end 0", "end 1", "prepare 0", "prepare 1", "commit 0",
            "commit 1");

    /** Enlists {@code resources} in the transaction of {@code tm}'s thread, in this order. */
    static void enlist(DecreeTransactionManager tm, XAResource... resources) throws Exception {
        for (XAResource r : resources) {
            tm.getTransaction().enlistResource(r);
        }
    }

    private String n(Xid xid) {
        return Integer.toString(DecreeXid.copyOf(xid).branchNumber());
    }

    private static XAException xa(int code) {
        XAException e = new XAException("injected");
        e.errorCode = code;
        return e;
    }

    @Override
    public String rmName() {
        return rm;
    }

    @Override
    public void start(Xid xid, int flags) {
        xids.add(xid);
        journal.add("start " + n(xid) + (flags == TMJOIN ? " join" : flags == TMRESUME ? " resume" : ""));
    }

    @Override
    public void end(Xid xid, int flags) {
        journal.add("end " + n(xid) + (flags == TMFAIL ? " fail" : flags == TMSUSPEND ? " suspend" : ""));
    }

    @Override
    public int prepare(Xid xid) throws XAException {
        journal.add("prepare " + n(xid));
        if (onPrepare != null) {
            onPrepare.run();
        }
        if (failPrepare != null) {
            throw xa(failPrepare);
        }
        return vote;
    }

    @Override
    public void commit(Xid xid, boolean onePhase) throws XAException {
        journal.add("commit " + n(xid) + (onePhase ? " 1p" : ""));
        if (onCommit != null) {
            onCommit.run();
        }
        if (failCommit != null) {
            throw xa(failCommit);
        }
    }

    @Override
    public void rollback(Xid xid) throws XAException {
        journal.add("rollback " + n(xid));
        if (failRollback != null) {
            throw xa(failRollback);
        }
    }

    @Override
    public void forget(Xid xid) {
        journal.add("forget " + n(xid));
        if (onForget != null) {
            onForget.run();
        }
    }

    @Override
    public Xid[] recover(int flag) {
        return new Xid[0];
    }

    @Override
    public boolean isSameRM(XAResource other) {
        return other == this;
    }

    @Override
    public int getTransactionTimeout() {
        return 0;
    }

    @Override
    public boolean setTransactionTimeout(int seconds) {
        return false;
    }

    @Override
    public void abandon() {
        abandoned = true;
    }
}
