package dev.decree.jta;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

/**
 * The child JVM of {@link CrashTest}: moves money between two databases with decree-jta and,
 * at the commit step it is told, prints {@code STEP <step> <xid>} and waits to be killed.
 * Arguments: endpoint, step, transfer id, then per database: rm, JDBC URL, user. Its
 * {@link #stopAt} and {@link #killAtStep} serve the starter's SpringCrashWorker and
 * SpringCrashTest too.
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
        stopAt(step);
        tm.begin();
        Bank.transfer(from, to, transfer, 10);
        tm.commit();
        System.out.println("COMMITTED " + transfer);
        System.out.flush();
        System.exit(0);
    }

    /** Makes this JVM, at the commit step {@code step}, print {@code STEP <step> <xid>} and wait to be killed. */
    public static void stopAt(String step) {
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
    }

    /** What {@link #killAtStep} saw: the child's {@code STEP} line (null: it printed none), and all it printed. */
    public record Killed(String stepLine, String out) {}

    /** Starts the worker {@code pb} and kills it (SIGKILL) once it prints its {@code STEP} line, or when it ends without. */
    public static Killed killAtStep(ProcessBuilder pb) throws Exception {
        Process child = pb.redirectErrorStream(true).start();
        StringBuilder out = new StringBuilder();
        String stepLine = null;
        try (BufferedReader r = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8))) {
            String line;
            while ((line = r.readLine()) != null) {
                out.append(line).append('\n');
                if (line.startsWith("STEP ")) {
                    stepLine = line;
                    child.destroyForcibly(); // SIGKILL
                    break;
                }
            }
        } finally {
            child.destroyForcibly();
            child.waitFor(20, TimeUnit.SECONDS);
        }
        return new Killed(stepLine, out.toString());
    }

    private static Properties props(String user) {
        Properties p = new Properties();
        p.setProperty("user", user);
        return p;
    }
}
