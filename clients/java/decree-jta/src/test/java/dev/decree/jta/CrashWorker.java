package dev.decree.jta;

import java.sql.Connection;
import java.util.Properties;

/**
 * The child JVM of {@link CrashTest}: moves money between two databases with decree-jta and,
 * at the commit step it is told, prints {@code STEP <step> <xid>} and waits to be killed.
 * Arguments: endpoint, step, transfer id, then per database: rm, JDBC URL, user.
 */
public final class CrashWorker {
    private CrashWorker() {}

    public static void main(String[] args) throws Exception {
        String endpoint = args[0];
        String step = args[1];
        String transfer = args[2];
        DecreeTransactionManager tm = DecreeTransactionManager.connect(endpoint);
        tm.setParallelBranchCalls(Boolean.getBoolean("decree.parallel"));
        DecreeDataSource from = new DecreeDataSource(tm, args[3], args[4], props(args[5]), 2);
        DecreeDataSource to = new DecreeDataSource(tm, args[6], args[7], props(args[8]), 2);
        Hooks.hook = (name, xid) -> {
            if (name.equals(step)) {
                System.out.println("STEP " + name + " " + xid);
                System.out.flush();
                while (true) {
                    try {
                        Thread.sleep(60_000);
                    } catch (InterruptedException e) {
                        // wait for SIGKILL
                    }
                }
            }
        };
        tm.begin();
        try (Connection c = from.getConnection()) {
            Bank.leg(c, transfer, -10);
        }
        try (Connection c = to.getConnection()) {
            Bank.leg(c, transfer, 10);
        }
        tm.commit();
        System.out.println("COMMITTED " + transfer);
        System.out.flush();
        System.exit(0);
    }

    private static Properties props(String user) {
        Properties p = new Properties();
        p.setProperty("user", user);
        return p;
    }
}
