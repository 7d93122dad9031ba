package dev.decree.jta;

import jakarta.transaction.SystemException;

/**
 * The outcome of the transaction is not known to this client and the server could not prove
 * it either (a one-phase commit whose answer was lost: only the database knows; a decision
 * whose write failed on the server; an {@code Outcome} answered unknown). The transaction may
 * be committed or rolled back: never retry its work blindly. Its branches are left to the
 * server (or to {@code decree recover}); {@link #xid()} names it.
 */
public class OutcomeUnknownException extends SystemException {
    private final transient DecreeXid xid;

    public OutcomeUnknownException(String message, DecreeXid xid, Throwable cause) {
        super(message);
        this.xid = xid;
        if (cause != null) {
            initCause(cause);
        }
    }

    /** The global Xid of the transaction whose outcome is unknown. */
    public DecreeXid xid() {
        return xid;
    }
}
