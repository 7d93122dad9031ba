package dev.decree.jta;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import javax.sql.DataSource;

/**
 * The tables the database tests move money between: {@code decree_java_account} (one row,
 * id 1) and {@code decree_java_ledger} (one row per transfer, by transfer id) in each
 * database; and what the databases hold prepared for a decree node.
 */
public final class Bank {
    private Bank() {}

    public static Connection plain(TestEnv.Db db) throws SQLException {
        return DriverManager.getConnection(db.jdbcUrl(), db.properties());
    }

    /** Creates the tables in each of {@code dbs} unless there. */
    public static void setUp(TestEnv.Db... dbs) throws SQLException {
        for (TestEnv.Db db : dbs) {
            setUp(db);
        }
    }

    private static void setUp(TestEnv.Db db) throws SQLException {
        try (Connection c = plain(db); Statement s = c.createStatement()) {
            s.execute("CREATE TABLE IF NOT EXISTS decree_java_account (id INT PRIMARY KEY, balance BIGINT NOT NULL)");
            s.execute("CREATE TABLE IF NOT EXISTS decree_java_ledger (transfer VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL)"
                    + (db.kind().equals("mariadb") ? " ENGINE=InnoDB" : ""));
            if (db.kind().equals("mariadb")) {
                s.execute("INSERT IGNORE INTO decree_java_account VALUES (1, 1000000)");
            } else {
                s.execute("INSERT INTO decree_java_account VALUES (1, 1000000) ON CONFLICT DO NOTHING");
            }
        }
    }

    /** One leg of a transfer on a connection of the transaction: the balance moves, the ledger says so. */
    public static void leg(Connection c, String transfer, long amount) throws SQLException {
        try (PreparedStatement p = c.prepareStatement("UPDATE decree_java_account SET balance = balance + ? WHERE id = 1")) {
            p.setLong(1, amount);
            p.executeUpdate();
        }
        try (PreparedStatement p = c.prepareStatement("INSERT INTO decree_java_ledger VALUES (?, ?)")) {
            p.setString(1, transfer);
            p.setLong(2, amount);
            p.executeUpdate();
        }
    }

    /** A transfer {@code transfer} of {@code amount} in the transaction: a leg on a connection of each data source. */
    public static void transfer(DataSource from, DataSource to, String transfer, long amount) throws SQLException {
        leg(from, transfer, -amount);
        leg(to, transfer, amount);
    }

    /** One leg of a transfer on a connection of {@code ds} in the transaction. */
    public static void leg(DataSource ds, String transfer, long amount) throws SQLException {
        try (Connection c = ds.getConnection()) {
            leg(c, transfer, amount);
        }
    }

    /** A pool of {@code max} connections to {@code db}, under its rm name, for {@code tm}'s transactions. */
    public static DecreeDataSource dataSource(DecreeTransactionManager tm, TestEnv.Db db, int max) {
        return new DecreeDataSource(tm, db.rm(), db.jdbcUrl(), db.properties(), max);
    }

    public static long balance(TestEnv.Db db) throws SQLException {
        try (Connection c = plain(db); Statement s = c.createStatement();
                ResultSet r = s.executeQuery("SELECT balance FROM decree_java_account WHERE id = 1")) {
            r.next();
            return r.getLong(1);
        }
    }

    public static boolean has(TestEnv.Db db, String transfer) throws SQLException {
        try (Connection c = plain(db); PreparedStatement p = c.prepareStatement("SELECT 1 FROM decree_java_ledger WHERE transfer = ?")) {
            p.setString(1, transfer);
            try (ResultSet r = p.executeQuery()) {
                return r.next();
            }
        }
    }

    /** Sum of the ledger of transfers whose id starts with {@code prefix}. */
    static long ledgerSum(TestEnv.Db db, String prefix) throws SQLException {
        try (Connection c = plain(db); PreparedStatement p = c.prepareStatement(
                "SELECT COALESCE(SUM(amount), 0) FROM decree_java_ledger WHERE transfer LIKE ?")) {
            p.setString(1, prefix + "%");
            try (ResultSet r = p.executeQuery()) {
                r.next();
                return r.getLong(1);
            }
        }
    }

    static Set<String> transfers(TestEnv.Db db, String prefix) throws SQLException {
        Set<String> out = new HashSet<>();
        try (Connection c = plain(db); PreparedStatement p = c.prepareStatement("SELECT transfer FROM decree_java_ledger WHERE transfer LIKE ?")) {
            p.setString(1, prefix + "%");
            try (ResultSet r = p.executeQuery()) {
                while (r.next()) {
                    out.add(r.getString(1));
                }
            }
        }
        return out;
    }

    /** The branches of decree node {@code node} that {@code db} holds prepared (PostgreSQL gids, MariaDB XA RECOVER rows). */
    public static List<String> prepared(TestEnv.Db db, long node) throws SQLException {
        List<String> out = new ArrayList<>();
        try (Connection c = plain(db); Statement s = c.createStatement()) {
            if (db.kind().equals("postgres")) {
                try (ResultSet r = s.executeQuery("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")) {
                    String prefix = "decree:64637265:" + String.format("%08x", node);
                    while (r.next()) {
                        String gid = r.getString(1);
                        if (gid.startsWith(prefix) || pgjdbcFormOfNode(gid, node)) {
                            out.add(gid);
                        }
                    }
                }
            } else {
                try (ResultSet r = s.executeQuery("XA RECOVER")) {
                    while (r.next()) {
                        DecreeXid x = DecreeXid.fromXaRecover(r.getInt(1), r.getInt(2), r.getInt(3), r.getBytes(4));
                        if (x.isDecree() && x.node() == node) {
                            out.add(x.toString());
                        }
                    }
                }
            }
        }
        return out;
    }

    /** Whether {@code gid} is pgjdbc's form {@code 1684238949_<base64 gtrid>_<base64 bqual>} of a decree Xid of {@code node}. */
    static boolean pgjdbcFormOfNode(String gid, long node) {
        String[] parts = gid.split("_");
        if (parts.length != 3 || !parts[0].equals("1684238949")) {
            return false;
        }
        try {
            byte[] gtrid = java.util.Base64.getDecoder().decode(parts[1]);
            return gtrid.length == 28 && (java.nio.ByteBuffer.wrap(gtrid).getInt() & 0xffffffffL) == node;
        } catch (IllegalArgumentException e) {
            return false;
        }
    }

    /** Waits until no database holds a prepared branch of {@code node}; the branches still there after {@code seconds}. */
    public static List<String> awaitNothingPrepared(long node, int seconds, TestEnv.Db... dbs) throws Exception {
        long deadline = System.nanoTime() + seconds * 1_000_000_000L;
        while (true) {
            List<String> left = new ArrayList<>();
            for (TestEnv.Db db : dbs) {
                for (String p : prepared(db, node)) {
                    left.add(db.rm() + ": " + p);
                }
            }
            if (left.isEmpty() || System.nanoTime() > deadline) {
                return left;
            }
            Thread.sleep(100);
        }
    }
}
