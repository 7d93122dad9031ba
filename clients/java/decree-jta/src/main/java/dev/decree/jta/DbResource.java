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

    // --- PostgreSQL --------------------------------------------------------------------------

    /**
     * A PostgreSQL branch: autocommit off, the application's SQL, then {@code PREPARE
     * TRANSACTION 'decree:...'} (after a check, in the same round trip, that the transaction
     * is not aborted and whether it wrote anything: a branch that wrote nothing commits and
     * votes {@code XA_RDONLY}), {@code COMMIT PREPARED} / {@code ROLLBACK PREPARED} by gid.
     */
    static final class Postgres extends DbResource {
        Postgres(PooledConnection pooled, String rm) {
            super(pooled, rm);
        }

        @Override
        public void start(Xid x, int flags) throws XAException {
            DecreeXid d = DecreeXid.copyOf(x);
            if (flags == TMJOIN || flags == TMRESUME) {
                checkXid(d, "start");
                return;
            }
            if (state != State.IDLE) {
                throw xa(XAException.XAER_PROTO, rm + ": the connection already has branch " + xid + " " + state, null);
            }
            try {
                if (!conn().getAutoCommit()) {
                    conn().rollback();
                }
                conn().setAutoCommit(false);
            } catch (SQLException e) {
                throw xa(XAException.XAER_RMFAIL, rm + ": cannot start a branch: " + e.getMessage(), e);
            }
            xid = d;
            state = State.ACTIVE;
        }

        private void toIdle() {
            state = State.IDLE;
            try {
                conn().setAutoCommit(true);
            } catch (SQLException e) {
                pooled.discard("setAutoCommit failed: " + e.getMessage());
            }
        }

        private void rollbackOpen() {
            try {
                conn().rollback();
            } catch (SQLException e) {
                pooled.discard("rollback failed: " + e.getMessage());
            }
            toIdle();
        }

        @Override
        public int prepare(Xid x) throws XAException {
            checkXid(x, "prepare");
            if (state != State.ACTIVE) {
                throw xa(XAException.XAER_PROTO, rm + ": prepare of a branch that is " + state, null);
            }
            // The check and the PREPARE go in one round trip: an aborted transaction fails the
            // SELECT, and PostgreSQL then skips the PREPARE (which it would have answered with
            // a silent ROLLBACK). The SELECT also says whether the branch wrote anything.
            boolean nothingWritten;
            try (Statement s = conn().createStatement()) {
                s.execute("SELECT txid_current_if_assigned() IS NULL; PREPARE TRANSACTION '" + xid.pgGid() + "'");
                try (ResultSet r = s.getResultSet()) {
                    r.next();
                    nothingWritten = r.getBoolean(1);
                }
            } catch (SQLException e) {
                if (lost(e)) {
                    state = State.IN_DOUBT;
                    pooled.discard("lost: " + e.getMessage());
                    throw xa(XAException.XAER_RMFAIL, rm + ": PREPARE TRANSACTION lost its answer: " + e.getMessage(), e);
                }
                rollbackOpen();
                throw xa(XAException.XA_RBROLLBACK, rm + ": PREPARE TRANSACTION failed (or an earlier statement had aborted the "
                        + "transaction): " + e.getMessage(), e);
            }
            if (nothingWritten) {
                // A branch that wrote nothing: finish its empty prepared transaction now and vote read-only.
                state = State.PREPARED;
                try {
                    conn().setAutoCommit(true);
                    run("COMMIT PREPARED '" + xid.pgGid() + "'");
                    state = State.IDLE;
                    return XA_RDONLY;
                } catch (SQLException e) {
                    return XA_OK; // still prepared: it takes part in the decision like any other.
                }
            }
            state = State.PREPARED;
            try {
                conn().setAutoCommit(true); // COMMIT PREPARED runs outside a transaction block.
            } catch (SQLException e) {
                pooled.discard("setAutoCommit failed: " + e.getMessage());
            }
            return XA_OK;
        }

        @Override
        public void commit(Xid x, boolean onePhase) throws XAException {
            checkXid(x, "commit");
            if (onePhase) {
                if (state != State.ACTIVE) {
                    throw xa(XAException.XAER_PROTO, rm + ": one-phase commit of a branch that is " + state, null);
                }
                // One round trip: PostgreSQL answers COMMIT of an aborted transaction with a silent
                // ROLLBACK, so the SELECT goes first; when it fails, the COMMIT is skipped.
                try (Statement s = conn().createStatement()) {
                    s.execute("SELECT txid_current_if_assigned() IS NULL; COMMIT");
                } catch (SQLException e) {
                    if (lost(e)) {
                        state = State.IDLE;
                        pooled.discard("lost: " + e.getMessage());
                        throw xa(XAException.XAER_RMFAIL, rm + ": COMMIT lost its answer: " + e.getMessage(), e);
                    }
                    rollbackOpen();
                    throw xa(XAException.XA_RBROLLBACK, rm + ": COMMIT failed (or an earlier statement had aborted the transaction): "
                            + e.getMessage(), e);
                }
                toIdle();
                return;
            }
            if (state != State.PREPARED && state != State.IN_DOUBT) {
                throw xa(XAException.XAER_PROTO, rm + ": commit of a branch that is " + state, null);
            }
            try {
                run("COMMIT PREPARED '" + xid.pgGid() + "'");
            } catch (SQLException e) {
                if ("42704".equals(e.getSQLState())) {
                    state = State.IDLE;
                    throw xa(XAException.XAER_NOTA, rm + ": already committed (" + e.getMessage() + ")", e);
                }
                if (lost(e)) {
                    pooled.discard("lost: " + e.getMessage());
                    throw xa(XAException.XAER_RMFAIL, rm + ": COMMIT PREPARED lost its answer: " + e.getMessage(), e);
                }
                // 55000 "is busy": another session (the server's recovery) is finishing it.
                throw xa(XAException.XA_RETRY, rm + ": COMMIT PREPARED not done: " + e.getMessage(), e);
            }
            state = State.IDLE;
        }

        @Override
        public void rollback(Xid x) throws XAException {
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
                    try {
                        run("ROLLBACK PREPARED '" + xid.pgGid() + "'");
                    } catch (SQLException e) {
                        if (!"42704".equals(e.getSQLState())) {
                            if (lost(e)) {
                                pooled.discard("lost: " + e.getMessage());
                            }
                            throw xa(XAException.XAER_RMFAIL, rm + ": ROLLBACK PREPARED failed: " + e.getMessage(), e);
                        }
                    }
                    state = State.IDLE;
                }
            }
        }

        @Override
        public Xid[] recover(int flag) throws XAException {
            List<Xid> out = new ArrayList<>();
            try (Statement s = conn().createStatement(); ResultSet r = s.executeQuery(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE 'decree:%'")) {
                while (r.next()) {
                    try {
                        out.add(DecreeXid.fromPgGid(r.getString(1)));
                    } catch (IllegalArgumentException e) {
                        // not one of decree's canonical gids.
                    }
                }
            } catch (SQLException e) {
                throw xa(XAException.XAER_RMERR, rm + ": listing prepared transactions failed: " + e.getMessage(), e);
            }
            return out.toArray(new Xid[0]);
        }

        @Override
        public void abandon() {
            // Any connection to the database may finish a PostgreSQL branch: keep the connection.
            if (state != State.IDLE) {
                state = State.IDLE;
                try {
                    conn().setAutoCommit(true);
                } catch (SQLException e) {
                    pooled.discard("setAutoCommit failed: " + e.getMessage());
                }
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
        public void start(Xid xi, int flags) throws XAException {
            DecreeXid d = DecreeXid.copyOf(xi);
            if (flags == TMJOIN || flags == TMRESUME) {
                checkXid(d, "start");
                return;
            }
            if (state != State.IDLE) {
                throw xa(XAException.XAER_PROTO, rm + ": the connection already has branch " + xid + " " + state, null);
            }
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
            xid = d;
            xaEnded = false;
            state = State.ACTIVE;
        }

        private void quietRollbackOpen() {
            try {
                if (!xaEnded) {
                    run("XA END " + x);
                    xaEnded = true;
                }
                run("XA ROLLBACK " + x);
            } catch (SQLException e) {
                pooled.discard("rollback of an open branch failed: " + e.getMessage());
            }
            state = State.IDLE;
        }

        @Override
        public int prepare(Xid xi) throws XAException {
            checkXid(xi, "prepare");
            if (state != State.ACTIVE) {
                throw xa(XAException.XAER_PROTO, rm + ": prepare of a branch that is " + state, null);
            }
            try {
                if (!xaEnded) {
                    run("XA END " + x);
                    xaEnded = true;
                }
                run("XA PREPARE " + x);
            } catch (SQLException e) {
                if (lost(e)) {
                    state = State.IN_DOUBT;
                    pooled.discard("lost: " + e.getMessage());
                    throw xa(XAException.XAER_RMFAIL, rm + ": XA PREPARE lost its answer: " + e.getMessage(), e);
                }
                quietRollbackOpen();
                throw xa(XAException.XA_RBROLLBACK, rm + ": XA END/PREPARE failed: " + e.getMessage(), e);
            }
            state = State.PREPARED;
            return XA_OK;
        }

        private boolean listed() throws SQLException {
            try (Statement s = conn().createStatement(); ResultSet r = s.executeQuery("XA RECOVER")) {
                while (r.next()) {
                    DecreeXid got = DecreeXid.fromXaRecover(r.getInt(1), r.getInt(2), r.getInt(3), r.getBytes(4));
                    if (got.equals(name)) {
                        return true;
                    }
                }
            }
            return false;
        }

        @Override
        public void commit(Xid xi, boolean onePhase) throws XAException {
            checkXid(xi, "commit");
            if (onePhase) {
                if (state != State.ACTIVE) {
                    throw xa(XAException.XAER_PROTO, rm + ": one-phase commit of a branch that is " + state, null);
                }
                try {
                    if (!xaEnded) {
                        run("XA END " + x);
                        xaEnded = true;
                    }
                    run("XA COMMIT " + x + " ONE PHASE");
                } catch (SQLException e) {
                    if (lost(e)) {
                        state = State.IDLE;
                        pooled.discard("lost: " + e.getMessage());
                        throw xa(XAException.XAER_RMFAIL, rm + ": XA COMMIT ONE PHASE lost its answer: " + e.getMessage(), e);
                    }
                    quietRollbackOpen();
                    throw xa(XAException.XA_RBROLLBACK, rm + ": XA COMMIT ONE PHASE failed: " + e.getMessage(), e);
                }
                state = State.IDLE;
                return;
            }
            if (state != State.PREPARED && state != State.IN_DOUBT) {
                throw xa(XAException.XAER_PROTO, rm + ": commit of a branch that is " + state, null);
            }
            try {
                run("XA COMMIT " + x);
            } catch (SQLException e) {
                int code = e.getErrorCode();
                if (xaRb(code)) {
                    state = State.IDLE;
                    throw xa(XAException.XA_HEURRB, rm + ": rolled back on its own: " + e.getMessage(), e);
                }
                if (code == XAER_NOTA) {
                    try {
                        if (!listed()) {
                            state = State.IDLE;
                            throw xa(XAException.XAER_NOTA, rm + ": already committed (" + e.getMessage() + ")", e);
                        }
                    } catch (SQLException e2) {
                        throw xa(XAException.XA_RETRY, rm + ": XA COMMIT: " + e.getMessage() + "; XA RECOVER failed: " + e2.getMessage(), e);
                    }
                }
                if (lost(e)) {
                    pooled.discard("lost: " + e.getMessage());
                    throw xa(XAException.XAER_RMFAIL, rm + ": XA COMMIT lost its answer: " + e.getMessage(), e);
                }
                throw xa(XAException.XA_RETRY, rm + ": XA COMMIT failed: " + e.getMessage(), e);
            }
            state = State.IDLE;
        }

        @Override
        public void rollback(Xid xi) throws XAException {
            checkXid(xi, "rollback");
            switch (state) {
                case IDLE -> {
                    return;
                }
                case ACTIVE -> {
                    quietRollbackOpen();
                    return;
                }
                default -> {
                    try {
                        run("XA ROLLBACK " + x);
                    } catch (SQLException e) {
                        int code = e.getErrorCode();
                        if (!(xaRb(code) || code == XAER_NOTA)) {
                            // Closing the connection detaches a prepared branch so that the server can roll it back.
                            pooled.discard("XA ROLLBACK failed: " + e.getMessage());
                            state = State.IDLE;
                            throw xa(XAException.XAER_RMFAIL, rm + ": XA ROLLBACK failed: " + e.getMessage(), e);
                        }
                    }
                    state = State.IDLE;
                }
            }
        }

        @Override
        public Xid[] recover(int flag) throws XAException {
            List<Xid> out = new ArrayList<>();
            try (Statement s = conn().createStatement(); ResultSet r = s.executeQuery("XA RECOVER")) {
                while (r.next()) {
                    out.add(DecreeXid.fromXaRecover(r.getInt(1), r.getInt(2), r.getInt(3), r.getBytes(4)));
                }
            } catch (SQLException e) {
                throw xa(XAException.XAER_RMERR, rm + ": XA RECOVER failed: " + e.getMessage(), e);
            }
            return out.toArray(new Xid[0]);
        }

        @Override
        public boolean holdsPrepared() {
            return state == State.PREPARED || state == State.IN_DOUBT;
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
