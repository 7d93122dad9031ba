package dev.decree.bench;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.function.IntFunction;

/**
 * The load of both benchmarks (JtaBench, DbBench): threads that each repeat one operation
 * until stopped, a warm-up, then a measured window in which every operation's latency is
 * kept; the throughput and the median and 99th percentile latencies of the window.
 */
final class Load {
    private Load() {}

    interface Operation {
        void run() throws Exception;
    }

    /** What a run measured. */
    record Result(long operations, double tps, double p50us, double p99us) {
        /** One JSON line: {@code "label":"value"} first, then threads, tps, p50_us, p99_us and {@code "count":operations}. */
        String json(String label, String value, int threads, String count) {
            return String.format(Locale.ROOT, "{\"%s\":\"%s\",\"threads\":%d,\"tps\":%.0f,\"p50_us\":%.0f,\"p99_us\":%.0f,\"%s\":%d}",
                    label, value, threads, tps, p50us, p99us, count, operations);
        }
    }

    /**
     * Runs {@code threads} threads, thread {@code t} repeating {@code operation.apply(t)}, for
     * {@code warmup} and then {@code seconds} measured seconds; the first failure of a thread
     * stops them all and is thrown.
     */
    static Result run(int threads, int seconds, int warmup, IntFunction<Operation> operation) throws Exception {
        AtomicBoolean measuring = new AtomicBoolean();
        AtomicBoolean stop = new AtomicBoolean();
        List<long[]> latencies = new ArrayList<>();
        Throwable[] failure = new Throwable[1];
        CountDownLatch done = new CountDownLatch(threads);
        for (int t = 0; t < threads; t++) {
            Operation op = operation.apply(t);
            Thread th = new Thread(() -> {
                long[] mine = new long[1 << 16];
                int n = 0;
                try {
                    while (!stop.get()) {
                        long t0 = System.nanoTime();
                        op.run();
                        long dt = System.nanoTime() - t0;
                        if (measuring.get()) {
                            if (n == mine.length) {
                                mine = Arrays.copyOf(mine, n * 2);
                            }
                            mine[n++] = dt;
                        }
                    }
                } catch (Throwable e) {
                    synchronized (failure) {
                        if (failure[0] == null) {
                            failure[0] = e;
                        }
                    }
                    stop.set(true);
                } finally {
                    synchronized (latencies) {
                        latencies.add(Arrays.copyOf(mine, n));
                    }
                    done.countDown();
                }
            }, "bench-" + t);
            th.setDaemon(true);
            th.start();
        }
        Thread.sleep(warmup * 1000L);
        measuring.set(true);
        long start = System.nanoTime();
        Thread.sleep(seconds * 1000L);
        measuring.set(false);
        long elapsed = System.nanoTime() - start;
        stop.set(true);
        done.await();
        synchronized (failure) {
            if (failure[0] instanceof Exception e) {
                throw e;
            } else if (failure[0] != null) {
                throw new IllegalStateException(failure[0]);
            }
        }
        long[] all = latencies.stream().flatMapToLong(Arrays::stream).sorted().toArray();
        double p50 = all.length == 0 ? 0 : all[all.length / 2] / 1e3;
        double p99 = all.length == 0 ? 0 : all[(int) Math.min(all.length - 1, Math.ceil(all.length * 0.99) - 1)] / 1e3;
        return new Result(all.length, all.length / (elapsed / 1e9), p50, p99);
    }
}
