package dev.decree.bench;

import dev.decree.jta.DecreeResource;
import dev.decree.jta.DecreeTransactionManager;
import jakarta.transaction.Transaction;
import jakarta.transaction.TransactionManager;
import java.io.IOException;
import java.io.Serializable;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Locale;
import javax.transaction.xa.XAException;
import javax.transaction.xa.XAResource;
import javax.transaction.xa.Xid;

/**
 * One run of the JTA benchmark in the shape of Narayana's own performance suite: each thread
 * begins a transaction, enlists two no-op XAResources that vote yes, and commits, for a
 * warm-up and then a measured time; one transaction manager per JVM. Prints one JSON line:
 * tm, threads, tps, p50 and p99 latency of a whole transaction in microseconds.
 *
 * <pre>
 * java -cp 'lib/*' dev.decree.bench.JtaBench TM THREADS SECONDS WARMUP_SECONDS DIR [ENDPOINT]
 *   TM: decree (ENDPOINT: the server, with [[rm]] d1 and d2 of kind dummy), narayana-slot,
 *       narayana-journal, atomikos (DIR: where their durable logs go), or fsync (DIR: the
 *       disk's synced 4 KiB write rate, one thread)
 * </pre>
 */
public final class JtaBench {
    private JtaBench() {}

    /** Votes yes and does nothing; serializable, as a recoverable resource of Narayana's must be. */
    static final class NoopResource implements XAResource, Serializable {
        private static final long serialVersionUID = 1L;

        @Override
        public void commit(Xid xid, boolean onePhase) {}

        @Override
        public void end(Xid xid, int flags) {}

        @Override
        public void forget(Xid xid) {}

        @Override
        public int getTransactionTimeout() {
            return 0;
        }

        @Override
        public boolean isSameRM(XAResource other) {
            return other == this;
        }

        @Override
        public int prepare(Xid xid) {
            return XA_OK;
        }

        @Override
        public Xid[] recover(int flag) {
            return new Xid[0];
        }

        @Override
        public void rollback(Xid xid) {}

        @Override
        public boolean setTransactionTimeout(int seconds) {
            return false;
        }

        @Override
        public void start(Xid xid, int flags) {}
    }

    interface Resources {
        XAResource first();

        XAResource second();
    }

    public static void main(String[] args) throws Exception {
        String tmName = args[0];
        int threads = Integer.parseInt(args[1]);
        int seconds = Integer.parseInt(args[2]);
        int warmup = Integer.parseInt(args[3]);
        Path dir = Path.of(args[4]);
        Files.createDirectories(dir);
        if (tmName.equals("fsync")) {
            System.out.println(String.format(Locale.ROOT, "{\"tm\":\"fsync\",\"writes_per_s\":%.0f}", fsyncRate(dir, seconds)));
            return;
        }
        TransactionManager tm;
        Resources res;
        AutoCloseable closer = () -> {};
        switch (tmName) {
            case "decree" -> {
                DecreeTransactionManager d = DecreeTransactionManager.connect(args[5]);
                // The no-op resources make no round trip: handing their calls to other threads
                // would only cost (measured: about a third of the throughput), so the branches
                // are called one after the other, as Narayana and Atomikos do by default.
                // -Ddecree.parallel=true measures decree-jta's default for real resources.
                d.setParallelBranchCalls(Boolean.parseBoolean(System.getProperty("decree.parallel", "false")));
                tm = d;
                closer = d;
                res = new Resources() {
                    public XAResource first() {
                        return DecreeResource.named(new NoopResource(), "d1");
                    }

                    public XAResource second() {
                        return DecreeResource.named(new NoopResource(), "d2");
                    }
                };
            }
            case "narayana-slot", "narayana-journal" -> {
                tm = Narayana.start(tmName.endsWith("slot"), dir);
                res = noop();
            }
            case "atomikos" -> {
                com.atomikos.icatch.jta.UserTransactionManager utm = Atomikos.start(dir);
                tm = utm;
                closer = utm::close;
                res = noop();
            }
            default -> throw new IllegalArgumentException("unknown transaction manager " + tmName);
        }
        TransactionManager m = tm;
        Load.Result r;
        try {
            r = Load.run(threads, seconds, warmup, t -> () -> {
                m.begin();
                Transaction tx = m.getTransaction();
                tx.enlistResource(res.first());
                tx.enlistResource(res.second());
                m.commit();
            });
        } catch (Exception e) {
            e.printStackTrace();
            System.exit(1);
            return;
        }
        System.out.println(r.json("tm", tmName, threads, "commits"));
        closer.close();
        System.exit(0);
    }

    static Resources noop() {
        return new Resources() {
            public XAResource first() {
                return new NoopResource();
            }

            public XAResource second() {
                return new NoopResource();
            }
        };
    }

    /** The disk's rate of 4 KiB writes each followed by fdatasync (FileChannel.force(false)), for {@code seconds}. */
    static double fsyncRate(Path dir, int seconds) throws IOException {
        Path f = dir.resolve("fsync-probe");
        try (FileChannel ch = FileChannel.open(f, StandardOpenOption.CREATE, StandardOpenOption.WRITE, StandardOpenOption.READ)) {
            ByteBuffer page = ByteBuffer.allocate(4096);
            ch.write(page.duplicate(), 0);
            ch.force(true);
            long n = 0;
            long end = System.nanoTime() + seconds * 1_000_000_000L;
            long start = System.nanoTime();
            while (System.nanoTime() < end) {
                ch.write(page.duplicate(), 0);
                ch.force(false);
                n++;
            }
            return n / ((System.nanoTime() - start) / 1e9);
        } finally {
            Files.deleteIfExists(f);
        }
    }

    static XAException unused() {
        return new XAException();
    }
}
