package dev.decree.bench;

import dev.decree.jta.DecreeDataSource;
import dev.decree.jta.DecreeTransactionManager;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ThreadLocalRandom;

/**
 * decree-jta with real databases, in the shape of {@code decree bench --rm postgres}: a
 * transfer debits one of 10,000 accounts (uniform ids) in PostgreSQL database A by 1 and
 * credits one in B: as two independent local transactions ({@code independent}: BEGIN,
 * UPDATE, COMMIT on each, BEGIN waited for as decree bench does), as the databases' own
 * two-phase statements without a coordinator ({@code native-2pc}), or as one decree-jta
 * transaction over two {@link DecreeDataSource}s ({@code decree}, its default: branches
 * called in parallel while no more transactions call theirs than there are processors;
 * {@code decree-sequential}, one after the other; {@code decree-parallel}, always in
 * parallel); the modes run in the same JVM one after the other, each after a warm-up
 * (scripts/bench-java-db.sh runs each in a JVM of its own). Prints one JSON line per mode.
 *
 * <pre>
 * java -cp 'lib/*' dev.decree.bench.DbBench THREADS SECONDS WARMUP JDBC_URL_A JDBC_URL_B USER ENDPOINT
 * </pre>
 * The server's {@code [[rm]]} entries are {@code pg-a} and {@code pg-b}. The system property
 * {@code decree.bench.modes} (for example {@code -Ddecree.bench.modes=decree}) runs only the
 * modes it lists, to profile one of them.
 */
public final class DbBench {
    private DbBench() {}

    static final String TABLE = "decree_jbench_accounts";
    static final int ACCOUNTS = 10_000;

    interface Transfer {
        void run(int a, int b) throws Exception;
    }

    public static void main(String[] args) throws Exception {
        int threads = Integer.parseInt(args[0]);
        int seconds = Integer.parseInt(args[1]);
        int warmup = Integer.parseInt(args[2]);
        String urlA = args[3];
        String urlB = args[4];
        Properties props = new Properties();
        props.setProperty("user", args[5]);
        for (String url : new String[] {urlA, urlB}) {
            try (Connection c = DriverManager.getConnection(url, props); Statement s = c.createStatement()) {
                s.execute("CREATE TABLE IF NOT EXISTS " + TABLE + " (id int PRIMARY KEY, balance bigint NOT NULL)");
                s.execute("INSERT INTO " + TABLE + " SELECT g, 1000000 FROM generate_series(1, " + ACCOUNTS + ") g ON CONFLICT (id) DO NOTHING");
            }
        }
        String debit = "UPDATE " + TABLE + " SET balance = balance - 1 WHERE id = ?";
        String credit = "UPDATE " + TABLE + " SET balance = balance + 1 WHERE id = ?";

        // Independent commits, as decree bench runs them: per database a local transaction
        // (BEGIN as a statement of its own, the UPDATE, COMMIT) on a connection of the thread.
        List<Connection[]> conns = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            conns.add(new Connection[] {DriverManager.getConnection(urlA, props), DriverManager.getConnection(urlB, props)});
        }
        measure("independent", threads, seconds, warmup, index -> {
            Connection[] c = conns.get(index);
            return (a, b) -> {
                local(c[0], debit, a);
                local(c[1], credit, b);
            };
        });
        // The databases' own two-phase statements without a coordinator (decree bench's native-2pc).
        long[] seq = {0};
        measure("native-2pc", threads, seconds, warmup, index -> {
            Connection[] c = conns.get(index);
            return (a, b) -> {
                String gid;
                synchronized (seq) {
                    gid = "jbench-native-" + ProcessHandle.current().pid() + "-" + seq[0]++;
                }
                for (int side = 0; side < 2; side++) {
                    try (Statement s = c[side].createStatement()) {
                        s.execute("BEGIN");
                    }
                    update(c[side], side == 0 ? debit : credit, side == 0 ? a : b);
                    try (Statement s = c[side].createStatement()) {
                        s.execute("PREPARE TRANSACTION '" + gid + (side == 0 ? "-a'" : "-b'"));
                    }
                }
                try (Statement s = c[0].createStatement()) {
                    s.execute("COMMIT PREPARED '" + gid + "-a'");
                }
                try (Statement s = c[1].createStatement()) {
                    s.execute("COMMIT PREPARED '" + gid + "-b'");
                }
            };
        });
        for (Connection[] c : conns) {
            c[0].close();
            c[1].close();
        }

        try (DecreeTransactionManager tm = DecreeTransactionManager.connect(args[6]);
                DecreeDataSource dsA = new DecreeDataSource(tm, "pg-a", urlA, props, threads);
                DecreeDataSource dsB = new DecreeDataSource(tm, "pg-b", urlB, props, threads)) {
            dev.decree.jta.DecideTimer.install();
            for (String mode : new String[] {"decree-sequential", "decree-parallel", "decree"}) {
                // The default (decree): parallel branch calls while no more transactions call
                // their branches at once than the machine has processors.
                tm.setParallelBranchCalls(!mode.equals("decree-sequential"));
                tm.setParallelBranchCallsMax(mode.equals("decree-parallel") ? Integer.MAX_VALUE
                        : Runtime.getRuntime().availableProcessors());
                measure(mode, threads, seconds, warmup, index -> (a, b) -> {
                    tm.begin();
                    try {
                        try (Connection c = dsA.getConnection()) {
                            update(c, debit, a);
                        }
                        try (Connection c = dsB.getConnection()) {
                            update(c, credit, b);
                        }
                    } catch (Exception e) {
                        tm.rollback();
                        throw e;
                    }
                    tm.commit();
                });
            }
        }
        System.out.println(dev.decree.jta.DecideTimer.summary());
        System.exit(0);
    }

    /** BEGIN (waited for), the update, COMMIT: three round trips, on an autocommit connection. */
    static void local(Connection c, String sql, int id) throws SQLException {
        try (Statement s = c.createStatement()) {
            s.execute("BEGIN");
        }
        update(c, sql, id);
        try (Statement s = c.createStatement()) {
            s.execute("COMMIT");
        }
    }

    static void update(Connection c, String sql, int id) throws SQLException {
        try (PreparedStatement p = c.prepareStatement(sql)) {
            p.setInt(1, id);
            p.executeUpdate();
        }
    }

    interface Factory {
        Transfer make(int thread);
    }

    /** The modes to run: all, or those the system property {@code decree.bench.modes} lists (comma-separated). */
    static boolean wanted(String mode) {
        String only = System.getProperty("decree.bench.modes", "");
        return only.isEmpty() || java.util.Arrays.asList(only.split(",")).contains(mode);
    }

    static void measure(String mode, int threads, int seconds, int warmup, Factory factory) throws Exception {
        if (!wanted(mode)) {
            return;
        }
        Load.Result r = Load.run(threads, seconds, warmup, t -> {
            Transfer transfer = factory.make(t);
            return () -> {
                ThreadLocalRandom rng = ThreadLocalRandom.current(); // the worker thread's own
                transfer.run(rng.nextInt(1, ACCOUNTS + 1), rng.nextInt(1, ACCOUNTS + 1));
            };
        });
        System.out.println(r.json("mode", mode, threads, "transfers"));
    }
}
