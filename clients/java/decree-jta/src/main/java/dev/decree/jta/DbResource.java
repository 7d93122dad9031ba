package dev.decree.jta;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import javax.transaction.xa.XAException;
import javax.transaction.xa.XAResource;
import javax.transaction.xa.Xid;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The XAResource of one pooled database connection, which runs the statements of
 * docs/protocol.md, "Branches in the databases", itself, so that the branch is named exactly
 * as the server's recovery lists and finishes it: {@link Postgres} prepares under decree's
 * gid ({@code decree:<format>:<gtrid>:<bqual>}, not pgjdbc's base64 form), {@link MariaDb}
 * names the branch with the preparing connection's {@code CONNECTION_ID()}.
 *
 * <p>{@code end} sends nothing (the branch stays on its one connection; {@code TMJOIN} is
 * only ever this same connection again), so the application's SQL between enlistment and
 * commit is the branch.
 */
abstract class DbResource implements DecreeResource {
    static final Logger log = LoggerFactory.getLogger("dev.decree.jta");

    enum State { IDLE, ACTIVE, PREPARED, IN_DOUBT }

    final PooledConnection pooled;
    final String rm;
    DecreeXid xid;
    State state = State.IDLE;

    DbResource(PooledConnection pooled, String rm) {
        this.pooled = pooled;
        this.rm = rm;
    }

    Connection conn() {
        return pooled.connection;
    }

    @Override
    public String rmName() {
        return rm;
    }

    static XAException xa(int code, String message, Throwable cause) {
        return XaCodes.of(code, message, cause);
    }

    /** Whether {@code e} means the connection to the database is gone (the answer lost). */
    boolean lost(SQLException e) {
        String state = e.getSQLState();
        if (state != null && (state.startsWith("08") || state.equals("57P01") || state.equals("57P02") || state.equals("57P03"))) {
            return true;
        }
        if (e instanceof java.sql.SQLNonTransientConnectionException || e instanceof java.sql.SQLRecoverableException) {
            return true;
        }
        try {
            return conn().isClosed();
        } catch (SQLException e2) {
            return true;
        }
    }

    void run(String sql) throws SQLException {
        try (Statement s = conn().createStatement()) {
            s.execute(sql);
        }
    }

    void checkXid(Xid x, String call) throws XAException {
        if (xid == null || !xid.equals(DecreeXid.copyOf(x))) {
            throw xa(XAException.XAER_NOTA, rm + ": " + call + ": not this connection's branch " + x, null);
        }
    }

    @Override
    public void end(Xid x, int flags) throws XAException {
        checkXid(x, "end");
    }

    @Override
    public void forget(Xid x) {}

    @Override
    public int getTransactionTimeout() {
        return 0;
    }

    @Override
    public boolean setTransactionTimeout(int seconds) {
        return false;
    }

    @Override
    public boolean isSameRM(XAResource other) {
        return other == this; // never joined across connections.
    }

    /** Whether the connection is free for another transaction (no branch open or prepared on it). */
    boolean idle() {
        return state == State.IDLE;
    }

    @Override
    public void abandon() {
        pooled.discard("its branch is left to the server");
    }

    // --- The steps both databases share; what differs is in the methods below them -----------

    XAException proto(String call) {
        return xa(XAException.XAER_PROTO, rm + ": " + call + " of a branch that is " + state, null);
    }

    boolean prepared() {
        return state == State.PREPARED || state == State.IN_DOUBT;
    }

    @Override
    public final void start(Xid x, int flags) throws XAException {
        DecreeXid d = DecreeXid.copyOf(x);
        if (flags == TMJOIN || flags == TMRESUME) {
            checkXid(d, "start");
            return;
        }
        if (state != State.IDLE) {
            throw xa(XAException.XAER_PROTO, rm + ": the connection already has branch " + xid + " " + state, null);
        }
        begin(d);
        xid = d;
        state = State.ACTIVE;
    }

    @Override
    public final int prepare(Xid x) throws XAException {
        checkXid(x, "prepare");
        if (state != State.ACTIVE) {
            throw proto("prepare");
        }
        return prepareOpen();
    }

    @Override
    public final void commit(Xid x, boolean onePhase) throws XAException {
        checkXid(x, "commit");
        if (onePhase) {
            if (state != State.ACTIVE) {
                throw proto("one-phase commit");
            }
            commitOpen();
            return;
        }
        if (!prepared()) {
            throw proto("commit");
        }
        String commitPrepared = finishing("COMMIT");
        try {
            run(commitPrepared + " " + target());
        } catch (SQLException e) {
            XAException ended = commitPreparedEnded(e);
            if (ended != null) {
                state = State.IDLE;
                throw ended;
            }
            if (lost(e)) {
                pooled.discard("lost: " + e.getMessage());
                throw xa(XAException.XAER_RMFAIL, rm + ": " + commitPrepared + " lost its answer: " + e.getMessage(), e);
            }
            // PostgreSQL's 55000 "is busy": another session (the server's recovery) is finishing it.
            throw xa(XAException.XA_RETRY, rm + ": " + commitPrepared + " not done: " + e.getMessage(), e);
        }
        state = State.IDLE;
    }

    @Override
    public final void rollback(Xid x) throws XAException {
        checkXid(x, "rollback");
        switch (state) {
            case IDLE -> {
                return;
            }
            case ACTIVE -> {
                rollbackOpen();
                return;
            }
            default -> {
                String rollbackPrepared = finishing("ROLLBACK");
                try {
                    run(rollbackPrepared + " " + target());
                } catch (SQLException e) {
                    if (!gone(e)) {
                        rollbackPreparedFailed(e);
                        throw xa(XAException.XAER_RMFAIL, rm + ": " + rollbackPrepared + " failed: " + e.getMessage(), e);
                    }
                }
                state = State.IDLE;
            }
        }
    }

    @Override
    public final Xid[] recover(int flag) throws XAException {
        try {
            return listPrepared().toArray(new Xid[0]);
        } catch (SQLException e) {
            throw xa(XAException.XAER_RMERR, rm + ": " + recoverFailed() + ": " + e.getMessage(), e);
        }
    }

    /**
     * {@code e} from a statement that ends an open branch ({@code statement}: a prepare or a
     * one-phase commit): a lost answer leaves the branch {@code ifLost} and the connection
     * discarded; any other failure rolls the branch back.
     */
    XAException openEndFailed(SQLException e, State ifLost, String statement, String failed) {
        if (lost(e)) {
            state = ifLost;
            pooled.discard("lost: " + e.getMessage());
            return xa(XAException.XAER_RMFAIL, rm + ": " + statement + " lost its answer: " + e.getMessage(), e);
        }
        rollbackOpen();
        return xa(XAException.XA_RBROLLBACK, rm + ": " + failed + ": " + e.getMessage(), e);
    }

    /** Opens the branch {@code d} on the connection. */
    abstract void begin(DecreeXid d) throws XAException;

    /** Prepares the open branch (its state checked): {@code XA_OK} or {@code XA_RDONLY}. */
    abstract int prepareOpen() throws XAException;

    /** Commits the open branch in one phase (its state checked). */
    abstract void commitOpen() throws XAException;

    /** Rolls the open branch back, quietly (a failure discards the connection). */
    abstract void rollbackOpen();

    /** The statement that finishes a prepared branch with {@code verb} (COMMIT, ROLLBACK), before the branch's name. */
    abstract String finishing(String verb);

    /** The prepared branch's name in the statements of {@link #finishing}. */
    abstract String target();

    /**
     * The failure {@code e} of the commit of a prepared branch when it says the branch is finished
     * already (committed, or rolled back on its own): what the caller gets; null otherwise.
     */
    abstract XAException commitPreparedEnded(SQLException e) throws XAException;

    /** Whether the failure {@code e} of the rollback of a prepared branch says the branch is not there (rolled back already). */
    abstract boolean gone(SQLException e);

    /** What the connection needs after the rollback of a prepared branch failed otherwise. */
    abstract void rollbackPreparedFailed(SQLException e);

    /** The decree branches prepared in the database. */
    abstract List<DecreeXid> listPrepared() throws SQLException;

    /** The error message of a failed {@link #listPrepared}. */
    abstract String recoverFailed();

    // --- PostgreSQL --------------------------------------------------------------------------

    /**
     * A PostgreSQL branch: autocommit off, the application's SQL, then {@code PREPARE
     * TRANSACTION 'decree:...'} (after a check, in the same round trip, that the transaction
     * is not aborted and whether it wrote anything: a branch that wrote nothing commits and
     * votes {@code XA_RDONLY}), {@code COMMIT PREPARED} / {@code ROLLBACK PREPARED} by gid.
     */
    static final class Postgres extends DbResource {
        private static final String UNDEFINED_OBJECT = "42704";

        Postgres(PooledConnection pooled, String rm) {
            super(pooled, rm);
        }

        @Override
        void begin(DecreeXid d) throws XAException {
            try {
                if (!conn().getAutoCommit()) {
                    conn().rollback();
                }
                conn().setAutoCommit(false);
            } catch (SQLException e) {
                throw xa(XAException.XAER_RMFAIL, rm + ": cannot start a branch: " + e.getMessage(), e);
            }
        }

        /** Autocommit back on (COMMIT PREPARED runs outside a transaction block); false: the connection is discarded. */
        private boolean autoCommit() {
            try {
                conn().setAutoCommit(true);
                return true;
            } catch (SQLException e) {
                pooled.discard("setAutoCommit failed: " + e.getMessage());
                return false;
            }
        }

        private void toIdle() {
            state = State.IDLE;
            autoCommit();
        }

        @Override
        void rollbackOpen() {
            try {
                conn().rollback();
            } catch (SQLException e) {
                pooled.discard("rollback failed: " + e.getMessage());
            }
            toIdle();
        }

        @Override
        int prepareOpen() throws XAException {
            // The check and the PREPARE go in one round trip: an aborted transaction fails the
            // SELECT, and PostgreSQL then skips the PREPARE (which it would have answered with
            // a silent ROLLBACK). The SELECT also says whether the branch wrote anything.
            boolean nothingWritten;
            try (Statement s = conn().createStatement()) {
                s.execute("SELECT txid_current_if_assigned() IS NULL; PREPARE TRANSACTION " + target());
                try (ResultSet r = s.getResultSet()) {
                    r.next();
                    nothingWritten = r.getBoolean(1);
                }
            } catch (SQLException e) {
                throw openEndFailed(e, State.IN_DOUBT, "PREPARE TRANSACTION",
                        "PREPARE TRANSACTION failed (or an earlier statement had aborted the transaction)");
            }
            state = State.PREPARED;
            if (!autoCommit()) {
                return XA_OK;
            }
            if (nothingWritten) {
                // A branch that wrote nothing: finish its empty prepared transaction now and vote read-only.
                try {
                    run("COMMIT PREPARED " + target());
                    state = State.IDLE;
                    return XA_RDONLY;
                } catch (SQLException e) {
                    return XA_OK; // still prepared: it takes part in the decision like any other.
                }
            }
            return XA_OK;
        }

        @Override
        void commitOpen() throws XAException {
            // One round trip: PostgreSQL answers COMMIT of an aborted transaction with a silent
            // ROLLBACK, so the SELECT goes first; when it fails, the COMMIT is skipped.
            try (Statement s = conn().createStatement()) {
                s.execute("SELECT txid_current_if_assigned() IS NULL; COMMIT");
            } catch (SQLException e) {
                throw openEndFailed(e, State.IDLE, "COMMIT", "COMMIT failed (or an earlier statement had aborted the transaction)");
            }
            toIdle();
        }

        @Override
        String finishing(String verb) {
            return verb + " PREPARED";
        }

        @Override
        String target() {
            return "'" + xid.pgGid() + "'";
        }

        @Override
        XAException commitPreparedEnded(SQLException e) {
            if (UNDEFINED_OBJECT.equals(e.getSQLState())) {
                return xa(XAException.XAER_NOTA, rm + ": already committed (" + e.getMessage() + ")", e);
            }
            return null;
        }

        @Override
        boolean gone(SQLException e) {
            return UNDEFINED_OBJECT.equals(e.getSQLState());
        }

        @Override
        void rollbackPreparedFailed(SQLException e) {
            if (lost(e)) {
                pooled.discard("lost: " + e.getMessage());
            }
        }

        @Override
        List<DecreeXid> listPrepared() throws SQLException {
            List<DecreeXid> out = new ArrayList<>();
            try (Statement s = conn().createStatement(); ResultSet r = s.executeQuery(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE 'decree:%'")) {
                while (r.next()) {
                    try {
                        out.add(DecreeXid.fromPgGid(r.getString(1)));
                    } catch (IllegalArgumentException e) {
                        // not one of decree's canonical gids.
                    }
                }
            }
            return out;
        }

        @Override
        String recoverFailed() {
            return "listing prepared transactions failed";
        }

        @Override
        public void abandon() {
            // Any connection to the database may finish a PostgreSQL branch: keep the connection.
            if (state != State.IDLE) {
                toIdle();
            }
        }
    }

    // --- MariaDB / MySQL ---------------------------------------------------------------------

    /**
     * A MariaDB branch: {@code XA START} with the branch's name on the server (the branch
     * number and this connection's {@code CONNECTION_ID()}), the application's SQL, {@code XA
     * END} + {@code XA PREPARE}, then {@code XA COMMIT} on this same connection. A prepared
     * branch stays attached to its connection: when this client leaves it to the server, the
     * connection is closed ({@link #abandon}).
     */
    static final class MariaDb extends DbResource {
        private static final int XAER_NOTA = 1397;
        private static final int XAER_RMFAIL = 1399;
        private String x;
        private DecreeXid name;
        private boolean xaEnded;

        MariaDb(PooledConnection pooled, String rm) {
            super(pooled, rm);
        }

        private static boolean xaRb(int code) {
            return code == 1402 || code == 1613 || code == 1614;
        }

        @Override
        void begin(DecreeXid d) throws XAException {
            try {
                if (!conn().getAutoCommit()) {
                    conn().rollback();
                    conn().setAutoCommit(true); // MariaDB answers XAER_OUTSIDE to a commit by name otherwise.
                }
                name = d.mariadbName(pooled.connectionId());
                x = name.mysqlXid();
                run("XA START " + x);
            } catch (SQLException e) {
                throw xa(XAException.XAER_RMFAIL, rm + ": XA START failed: " + e.getMessage(), e);
            }
            xaEnded = false;
        }

        /** {@code XA END}, unless sent already, then {@code statement}. */
        private void endThen(String statement) throws SQLException {
            if (!xaEnded) {
                run("XA END " + x);
                xaEnded = true;
            }
            run(statement);
        }

        @Override
        void rollbackOpen() {
            try {
                endThen("XA ROLLBACK " + x);
            } catch (SQLException e) {
                pooled.discard("rollback of an open branch failed: " + e.getMessage());
            }
            state = State.IDLE;
        }

        @Override
        int prepareOpen() throws XAException {
            try {
                endThen("XA PREPARE " + x);
            } catch (SQLException e) {
                throw openEndFailed(e, State.IN_DOUBT, "XA PREPARE", "XA END/PREPARE failed");
            }
            state = State.PREPARED;
            return XA_OK;
        }

        @Override
        void commitOpen() throws XAException {
            try {
                endThen("XA COMMIT " + x + " ONE PHASE");
            } catch (SQLException e) {
                throw openEndFailed(e, State.IDLE, "XA COMMIT ONE PHASE", "XA COMMIT ONE PHASE failed");
            }
            state = State.IDLE;
        }

        @Override
        String finishing(String verb) {
            return "XA " + verb;
        }

        @Override
        String target() {
            return x;
        }

        @Override
        XAException commitPreparedEnded(SQLException e) throws XAException {
            int code = e.getErrorCode();
            if (xaRb(code)) {
                return xa(XAException.XA_HEURRB, rm + ": rolled back on its own: " + e.getMessage(), e);
            }
            if (code == XAER_NOTA) {
                try {
                    if (!listPrepared().contains(name)) {
                        return xa(XAException.XAER_NOTA, rm + ": already committed (" + e.getMessage() + ")", e);
                    }
                } catch (SQLException e2) {
                    throw xa(XAException.XA_RETRY, rm + ": XA COMMIT: " + e.getMessage() + "; XA RECOVER failed: " + e2.getMessage(), e);
                }
            }
            return null;
        }

        @Override
        boolean gone(SQLException e) {
            return xaRb(e.getErrorCode()) || e.getErrorCode() == XAER_NOTA;
        }

        @Override
        void rollbackPreparedFailed(SQLException e) {
            // Closing the connection detaches a prepared branch so that the server can roll it back.
            pooled.discard("XA ROLLBACK failed: " + e.getMessage());
            state = State.IDLE;
        }

        @Override
        List<DecreeXid> listPrepared() throws SQLException {
            List<DecreeXid> out = new ArrayList<>();
            try (Statement s = conn().createStatement(); ResultSet r = s.executeQuery("XA RECOVER")) {
                while (r.next()) {
                    out.add(DecreeXid.fromXaRecover(r.getInt(1), r.getInt(2), r.getInt(3), r.getBytes(4)));
                }
            }
            return out;
        }

        @Override
        String recoverFailed() {
            return "XA RECOVER failed";
        }

        @Override
        public boolean holdsPrepared() {
            return prepared();
        }

        @Override
        public void abandon() {
            if (state != State.IDLE) {
                state = State.IDLE;
                pooled.discard("its prepared branch is left to the server");
            }
        }

        boolean xaEndedForTest() {
            return xaEnded;
        }

        static boolean isXaerRmfail(int code) {
            return code == XAER_RMFAIL;
        }
    }
}
