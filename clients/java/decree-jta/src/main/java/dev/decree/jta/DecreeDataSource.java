package dev.decree.jta;

import jakarta.transaction.RollbackException;
import jakarta.transaction.SystemException;
import java.io.PrintWriter;
import java.lang.reflect.InvocationHandler;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.lang.reflect.Proxy;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.util.ArrayDeque;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.logging.Logger;
import javax.sql.DataSource;

/**
 * A pooled {@link DataSource} of one database whose connections take part in the current
 * JTA transaction of a {@link DecreeTransactionManager}: inside a transaction,
 * {@code getConnection()} enlists a connection of the pool as a branch under the server's
 * {@code [[rm]]} name {@link #rmName()} and hands out the same connection again to the same
 * transaction (so an ORM that takes a connection per statement works on one branch); outside
 * one, it gives an ordinary autocommit connection. PostgreSQL ({@code jdbc:postgresql:})
 * branches are prepared under decree's gid, MariaDB and MySQL ({@code jdbc:mariadb:},
 * {@code jdbc:mysql:}) branches under decree's xid with this connection's id
 * (docs/protocol.md, "Branches in the databases"), so that the server finishes them when
 * this JVM dies.
 *
 * <p>Inside a transaction the connection refuses {@code commit}, {@code rollback} and
 * {@code setAutoCommit(true)}: the transaction manager ends the branch.
 */
public final class DecreeDataSource implements DataSource, AutoCloseable {
    /** The database kinds, by JDBC URL. */
    public enum Kind { POSTGRES, MARIADB }

    private final DecreeTransactionManager tm;
    private final String rm;
    private final String url;
    private final Properties properties;
    private final Kind kind;
    private final int maxSize;
    private final ArrayDeque<PooledConnection> idle = new ArrayDeque<>();
    private int open;
    private long acquireTimeoutMs = 30_000;
    private volatile boolean closed;
    private final Object key = new Object();

    /**
     * A pool of at most {@code maxSize} connections to {@code jdbcUrl} with {@code properties}
     * (user, password, ...), whose branches the server finishes as {@code [[rm]]} {@code rm}.
     */
    public DecreeDataSource(DecreeTransactionManager tm, String rm, String jdbcUrl, Properties properties, int maxSize) {
        int n = rm.getBytes(java.nio.charset.StandardCharsets.UTF_8).length;
        if (n < 1 || n > Protocol.RM_NAME_BYTES_MAX) {
            throw new IllegalArgumentException("a resource manager name is 1 to 64 bytes, not \"" + rm + "\"");
        }
        if (maxSize < 1) {
            throw new IllegalArgumentException("maxSize is at least 1");
        }
        this.tm = tm;
        this.rm = rm;
        this.url = jdbcUrl;
        this.properties = (Properties) properties.clone();
        this.maxSize = maxSize;
        if (jdbcUrl.startsWith("jdbc:postgresql:")) {
            kind = Kind.POSTGRES;
        } else if (jdbcUrl.startsWith("jdbc:mariadb:") || jdbcUrl.startsWith("jdbc:mysql:")) {
            kind = Kind.MARIADB;
        } else {
            throw new IllegalArgumentException("decree finishes branches on PostgreSQL (jdbc:postgresql:) and MariaDB/MySQL "
                    + "(jdbc:mariadb:, jdbc:mysql:) only, not " + jdbcUrl);
        }
    }

    public DecreeDataSource(DecreeTransactionManager tm, String rm, String jdbcUrl, String user, String password, int maxSize) {
        this(tm, rm, jdbcUrl, credentials(user, password), maxSize);
    }

    private static Properties credentials(String user, String password) {
        Properties p = new Properties();
        if (user != null) {
            p.setProperty("user", user);
        }
        if (password != null) {
            p.setProperty("password", password);
        }
        return p;
    }

    public String rmName() {
        return rm;
    }

    public Kind kind() {
        return kind;
    }

    public DecreeTransactionManager transactionManager() {
        return tm;
    }

    /** How long {@code getConnection} waits for a free connection of a full pool (30 s by default). */
    public void setAcquireTimeoutMillis(long ms) {
        this.acquireTimeoutMs = ms;
    }

    // --- the pool ----------------------------------------------------------------------------

    private PooledConnection borrow() throws SQLException {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(acquireTimeoutMs);
        synchronized (idle) {
            while (true) {
                if (closed) {
                    throw new SQLException(rm + ": this DecreeDataSource is closed");
                }
                PooledConnection p = idle.pollLast();
                if (p != null) {
                    if (usable(p)) {
                        return p;
                    }
                    open--;
                    p.discard("not valid any more");
                    continue;
                }
                if (open < maxSize) {
                    open++;
                    break;
                }
                long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
                if (left <= 0) {
                    throw new java.sql.SQLTransientConnectionException(rm + ": no free connection within " + acquireTimeoutMs
                            + " ms (pool of " + maxSize + ")");
                }
                try {
                    idle.wait(left);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new SQLException(rm + ": interrupted while waiting for a connection", e);
                }
            }
        }
        try {
            Connection c = DriverManager.getConnection(url, properties);
            return new PooledConnection(this, c);
        } catch (SQLException | RuntimeException e) {
            synchronized (idle) {
                open--;
                idle.notifyAll();
            }
            throw e;
        }
    }

    private static boolean usable(PooledConnection p) {
        try {
            if (p.broken || p.connection.isClosed()) {
                return false;
            }
            if (System.nanoTime() - p.lastUsedNanos > TimeUnit.SECONDS.toNanos(30)) {
                return p.connection.isValid(2);
            }
            return true;
        } catch (SQLException e) {
            return false;
        }
    }

    void giveBack(PooledConnection p) {
        boolean keep = !p.broken && !closed && p.resource.idle();
        if (keep) {
            try {
                if (!p.connection.getAutoCommit()) {
                    p.connection.rollback();
                    p.connection.setAutoCommit(true);
                }
            } catch (SQLException e) {
                keep = false;
            }
        }
        if (!keep) {
            p.discard("not reusable");
        }
        synchronized (idle) {
            if (keep) {
                p.lastUsedNanos = System.nanoTime();
                idle.addLast(p);
            } else {
                open--;
            }
            idle.notifyAll();
        }
    }

    /** Closes the idle connections; connections in use close when given back. */
    @Override
    public void close() {
        closed = true;
        synchronized (idle) {
            for (PooledConnection p : idle) {
                p.discard("the data source is closed");
                open--;
            }
            idle.clear();
            idle.notifyAll();
        }
    }

    /** Connections open now (idle and in use). */
    public int openConnections() {
        synchronized (idle) {
            return open;
        }
    }

    // --- DataSource --------------------------------------------------------------------------

    @Override
    public Connection getConnection() throws SQLException {
        DecreeTransaction tx = tm.currentTransaction();
        if (tx == null) {
            PooledConnection p = borrow();
            return handle(p, null);
        }
        if (!tx.acceptsWork()) {
            throw new SQLException(rm + ": the current transaction " + tx.xid() + " is " + DecreeTransaction.statusName(tx.getStatus())
                    + "; no connection can join it");
        }
        PooledConnection p = (PooledConnection) tx.bound(key);
        if (p != null) {
            return handle(p, tx);
        }
        p = borrow();
        try {
            tx.enlistResource(p.resource);
        } catch (RollbackException | SystemException | IllegalStateException e) {
            giveBack(p);
            throw new SQLException(rm + ": cannot enlist in " + tx.xid() + ": " + e.getMessage(), e);
        }
        PooledConnection bound = p;
        tx.bind(key, p, () -> giveBack(bound));
        return handle(p, tx);
    }

    @Override
    public Connection getConnection(String username, String password) throws SQLException {
        throw new SQLFeatureNotSupportedException("a DecreeDataSource has one set of credentials");
    }

    private Connection handle(PooledConnection p, DecreeTransaction tx) {
        return (Connection) Proxy.newProxyInstance(Connection.class.getClassLoader(), new Class<?>[] {Connection.class},
                new Handle(p, tx));
    }

    /** One handle on a pooled connection: closing it gives the connection back (outside a transaction) or nothing (inside). */
    private final class Handle implements InvocationHandler {
        private final PooledConnection p;
        private final DecreeTransaction tx;
        private boolean closedHandle;

        Handle(PooledConnection p, DecreeTransaction tx) {
            this.p = p;
            this.tx = tx;
        }

        private boolean inTransaction() {
            return tx != null && !tx.finished();
        }

        @Override
        public Object invoke(Object proxy, Method m, Object[] args) throws Throwable {
            String name = m.getName();
            switch (name) {
                case "close" -> {
                    if (!closedHandle) {
                        closedHandle = true;
                        if (tx == null) {
                            giveBack(p);
                        }
                    }
                    return null;
                }
                case "isClosed" -> {
                    return closedHandle || (tx != null && tx.finished()) || p.connection.isClosed();
                }
                case "equals" -> {
                    return proxy == args[0];
                }
                case "hashCode" -> {
                    return System.identityHashCode(proxy);
                }
                case "toString" -> {
                    return "DecreeDataSource connection (" + rm + (tx != null ? ", in " + tx.xid() : "") + ")";
                }
                case "unwrap" -> {
                    Class<?> c = (Class<?>) args[0];
                    if (c.isInstance(proxy)) {
                        return proxy;
                    }
                    return p.connection.unwrap(c);
                }
                case "isWrapperFor" -> {
                    Class<?> c = (Class<?>) args[0];
                    return c.isInstance(proxy) || p.connection.isWrapperFor(c);
                }
                default -> {
                }
            }
            if (closedHandle) {
                throw new SQLException(rm + ": this connection handle is closed");
            }
            if (tx != null && tx.finished()) {
                throw new SQLException(rm + ": this connection belonged to transaction " + tx.xid() + ", which has ended");
            }
            if (inTransaction()) {
                switch (name) {
                    case "commit", "setAutoCommit" -> {
                        if (!name.equals("setAutoCommit") || Boolean.TRUE.equals(args[0])) {
                            throw new SQLException(rm + ": " + name + " inside the global transaction " + tx.xid()
                                    + ": the transaction manager commits the branch", "25000");
                        }
                        return null;
                    }
                    case "rollback" -> {
                        if (args == null || args.length == 0) {
                            throw new SQLException(rm + ": rollback inside the global transaction " + tx.xid()
                                    + ": use the transaction manager's rollback or setRollbackOnly", "25000");
                        }
                    }
                    case "getAutoCommit" -> {
                        return kind == Kind.POSTGRES ? p.connection.getAutoCommit() : Boolean.FALSE;
                    }
                    default -> {
                    }
                }
            }
            try {
                return m.invoke(p.connection, args);
            } catch (InvocationTargetException e) {
                throw e.getCause();
            }
        }
    }

    @Override
    public PrintWriter getLogWriter() {
        return null;
    }

    @Override
    public void setLogWriter(PrintWriter out) {}

    @Override
    public void setLoginTimeout(int seconds) {}

    @Override
    public int getLoginTimeout() {
        return 0;
    }

    @Override
    public Logger getParentLogger() throws SQLFeatureNotSupportedException {
        throw new SQLFeatureNotSupportedException();
    }

    @Override
    public <T> T unwrap(Class<T> iface) throws SQLException {
        if (iface.isInstance(this)) {
            return iface.cast(this);
        }
        throw new SQLException("not a wrapper for " + iface);
    }

    @Override
    public boolean isWrapperFor(Class<?> iface) {
        return iface.isInstance(this);
    }
}
