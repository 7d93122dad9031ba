package dev.decree.jta;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;

/** One physical database connection of a {@link DecreeDataSource}'s pool, with its XAResource. */
final class PooledConnection {
    final DecreeDataSource owner;
    final Connection connection;
    final DbResource resource;
    volatile boolean broken;
    long lastUsedNanos = System.nanoTime();
    private long connectionId = -1;

    PooledConnection(DecreeDataSource owner, Connection connection) {
        this.owner = owner;
        this.connection = connection;
        this.resource = owner.kind() == DecreeDataSource.Kind.POSTGRES ? new DbResource.Postgres(this, owner.rmName())
                : new DbResource.MariaDb(this, owner.rmName());
    }

    /** The full {@code CONNECTION_ID()} of a MariaDB connection, read once (the handshake's thread id holds only 32 bits). */
    long connectionId() throws SQLException {
        if (connectionId < 0) {
            try (Statement s = connection.createStatement(); ResultSet r = s.executeQuery("SELECT CONNECTION_ID()")) {
                r.next();
                connectionId = r.getLong(1);
            }
        }
        return connectionId;
    }

    /** Closes the physical connection and keeps it out of the pool. */
    void discard(String why) {
        if (!broken) {
            broken = true;
            DbResource.log.debug("{}: closing a connection: {}", owner.rmName(), why);
        }
        try {
            connection.close();
        } catch (SQLException e) {
            // already gone
        }
    }
}
