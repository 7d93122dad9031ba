package dev.decree.jta;

import java.nio.charset.StandardCharsets;
import javax.transaction.xa.XAException;
import javax.transaction.xa.XAResource;
import javax.transaction.xa.Xid;

/** An XAResource under a server {@code [[rm]]} name (DecreeResource.named). */
final class NamedResource implements DecreeResource {
    private final XAResource inner;
    private final String rm;

    NamedResource(XAResource inner, String rm) {
        int n = rm.getBytes(StandardCharsets.UTF_8).length;
        if (n < 1 || n > Protocol.RM_NAME_BYTES_MAX) {
            throw new IllegalArgumentException("a resource manager name is 1 to 64 bytes, not \"" + rm + "\"");
        }
        this.inner = inner;
        this.rm = rm;
    }

    XAResource inner() {
        return inner;
    }

    @Override
    public String rmName() {
        return rm;
    }

    @Override
    public void commit(Xid xid, boolean onePhase) throws XAException {
        inner.commit(xid, onePhase);
    }

    @Override
    public void end(Xid xid, int flags) throws XAException {
        inner.end(xid, flags);
    }

    @Override
    public void forget(Xid xid) throws XAException {
        inner.forget(xid);
    }

    @Override
    public int getTransactionTimeout() throws XAException {
        return inner.getTransactionTimeout();
    }

    @Override
    public boolean isSameRM(XAResource other) throws XAException {
        return other == this;
    }

    @Override
    public int prepare(Xid xid) throws XAException {
        return inner.prepare(xid);
    }

    @Override
    public Xid[] recover(int flag) throws XAException {
        return inner.recover(flag);
    }

    @Override
    public void rollback(Xid xid) throws XAException {
        inner.rollback(xid);
    }

    @Override
    public boolean setTransactionTimeout(int seconds) throws XAException {
        return inner.setTransactionTimeout(seconds);
    }

    @Override
    public void start(Xid xid, int flags) throws XAException {
        inner.start(xid, flags);
    }

    @Override
    public String toString() {
        return inner + " as " + rm;
    }
}
