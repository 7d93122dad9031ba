package dev.decree.jta;

import java.util.Arrays;
import java.util.Locale;

/** For the benchmark: the time from "every branch prepared" to "DecideOk read" per transaction (through the commit test points). */
public final class DecideTimer {
    private DecideTimer() {}

    private static final ThreadLocal<Long> START = new ThreadLocal<>();
    private static long[] samples = new long[1 << 16];
    private static int n;

    public static void install() {
        Hooks.hook = (step, xid) -> {
            if (step.equals("prepared")) {
                START.set(System.nanoTime());
            } else if (step.equals("decided")) {
                Long t0 = START.get();
                if (t0 != null) {
                    long dt = System.nanoTime() - t0;
                    synchronized (DecideTimer.class) {
                        if (n == samples.length) {
                            samples = Arrays.copyOf(samples, n * 2);
                        }
                        samples[n++] = dt;
                    }
                }
            }
        };
    }

    /** p50 / p99 of the decision's round trip in µs, and how many. */
    public static synchronized String summary() {
        long[] s = Arrays.copyOf(samples, n);
        Arrays.sort(s);
        if (s.length == 0) {
            return "{}";
        }
        return String.format(Locale.ROOT, "{\"decide_p50_us\":%.0f,\"decide_p99_us\":%.0f,\"decides\":%d}", s[s.length / 2] / 1e3,
                s[(int) Math.min(s.length - 1, Math.ceil(s.length * 0.99) - 1)] / 1e3, s.length);
    }
}
