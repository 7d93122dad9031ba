package dev.decree.jta;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.StandardProtocolFamily;
import java.net.URI;
import java.net.UnixDomainSocketAddress;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.channels.SocketChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

/**
 * One {@code decree serve} process on a Unix socket in a temporary directory under the
 * build directory; restartable on the same log, killable with SIGKILL, stoppable with
 * SIGSTOP. Every server gets a random node id: other test runs share the databases, and a
 * server's recovery only touches branches of its own node.
 */
public final class DecreeServer implements AutoCloseable {
    /** A {@code [[rm]]} entry: name, kind (postgres, mariadb, dummy), DSN (null for dummy). */
    public record Rm(String name, String kind, String dsn) {
        /** The entry of the test database {@code db}, under its rm name. */
        public static Rm of(TestEnv.Db db) {
            return new Rm(db.rm(), db.kind(), db.dsn());
        }
    }

    public final Path dir;
    public final Path socket;
    public final long node;
    final int metricsPort;
    private final Path config;
    private Process proc;
    private int starts;

    public DecreeServer(List<Rm> rms, String extra) throws IOException {
        this(rms, extra, ThreadLocalRandom.current().nextLong(1_000_000, 1L << 31));
    }

    /** A server of node {@code node} (the two members of a pair share theirs). */
    public DecreeServer(List<Rm> rms, String extra, long node) throws IOException {
        Path base = TestEnv.repo().resolve("target");
        Files.createDirectories(base);
        dir = Files.createTempDirectory(base, "decree-java-");
        socket = dir.resolve("decree.sock");
        this.node = node;
        metricsPort = freePort();
        List<String> lines = new ArrayList<>(List.of("node = " + node, "log_dir = \"" + dir.resolve("log") + "\"",
                "unix = \"" + socket + "\"", "metrics = \"127.0.0.1:" + metricsPort + "\"", extra));
        if (!extra.contains("[recovery]")) {
            lines.addAll(List.of("[recovery]", "periodic_pass_ms = 2000", "recheck_after_close_ms = 200", "rechecks_after_close = 4"));
        }
        for (Rm rm : rms) {
            lines.add("[[rm]]");
            lines.add("name = \"" + rm.name() + "\"");
            lines.add("kind = \"" + rm.kind() + "\"");
            if (rm.dsn() != null) {
                lines.add("dsn = \"" + rm.dsn() + "\"");
            }
        }
        config = dir.resolve("decree.toml");
        Files.writeString(config, String.join("\n", lines) + "\n");
    }

    /** A server (not started) whose resource managers are the test databases {@code dbs}, under their rm names. */
    public static DecreeServer over(TestEnv.Db... dbs) throws IOException {
        return over("", dbs);
    }

    /** The same, with the configuration lines {@code extra}. */
    public static DecreeServer over(String extra, TestEnv.Db... dbs) throws IOException {
        List<Rm> rms = new ArrayList<>();
        for (TestEnv.Db db : dbs) {
            rms.add(Rm.of(db));
        }
        return new DecreeServer(rms, extra);
    }

    public static DecreeServer dummy(String... names) throws IOException {
        return dummyWith("", names);
    }

    /** A server whose resource managers are the dummies {@code names}, with the configuration lines {@code extra}. */
    public static DecreeServer dummyWith(String extra, String... names) throws IOException {
        List<Rm> rms = new ArrayList<>();
        for (String n : names) {
            rms.add(new Rm(n, "dummy", null));
        }
        return new DecreeServer(rms, extra);
    }

    public static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket()) {
            s.bind(new InetSocketAddress("127.0.0.1", 0));
            return s.getLocalPort();
        }
    }

    public String endpoint() {
        return "unix:" + socket;
    }

    public DecreeServer start() throws IOException, InterruptedException {
        if (proc != null && proc.isAlive()) {
            throw new IllegalStateException("already running");
        }
        starts++;
        proc = new ProcessBuilder(TestEnv.decreeBin().toString(), "serve", "--config", config.toString(), "-v")
                .redirectErrorStream(true).redirectOutput(dir.resolve("serve-" + starts + ".log").toFile()).start();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
        while (System.nanoTime() < deadline) {
            if (!proc.isAlive()) {
                throw new IOException("decree serve exited with " + proc.exitValue() + ": " + logTail());
            }
            try (SocketChannel c = SocketChannel.open(StandardProtocolFamily.UNIX)) {
                c.connect(UnixDomainSocketAddress.of(socket));
                return this;
            } catch (IOException e) {
                Thread.sleep(20);
            }
        }
        throw new IOException("decree serve did not listen within 20 s: " + logTail());
    }

    public String logTail() {
        StringBuilder b = new StringBuilder();
        try (Stream<Path> files = Files.list(dir)) {
            for (Path p : files.filter(f -> f.getFileName().toString().startsWith("serve-")).sorted().toList()) {
                b.append(Files.readString(p));
            }
        } catch (IOException e) {
            b.append(e);
        }
        return b.length() > 4000 ? b.substring(b.length() - 4000) : b.toString();
    }

    /** Runs {@code decree <args> --config <this server's config>}; its output (the test fails if it fails). */
    public String control(String... args) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>(List.of(TestEnv.decreeBin().toString()));
        cmd.addAll(List.of(args));
        cmd.addAll(List.of("--config", config.toString()));
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes()).trim();
        if (p.waitFor() != 0) {
            throw new IOException(String.join(" ", cmd) + " failed: " + out);
        }
        return out;
    }

    long pid() {
        return proc.pid();
    }

    /** SIGKILL: the server dies at once, whatever it was doing. */
    public void kill() throws InterruptedException {
        if (proc != null && proc.isAlive()) {
            proc.destroyForcibly();
            proc.waitFor(10, TimeUnit.SECONDS);
        }
    }

    void signal(String sig) throws IOException, InterruptedException {
        new ProcessBuilder("kill", "-" + sig, Long.toString(proc.pid())).inheritIO().start().waitFor();
    }

    void stop() throws InterruptedException {
        if (proc != null && proc.isAlive()) {
            proc.destroy();
            if (!proc.waitFor(20, TimeUnit.SECONDS)) {
                kill();
            }
        }
    }

    Map<String, Double> metrics() throws IOException, InterruptedException {
        HttpClient c = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
        String text = c.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + metricsPort + "/metrics")).build(),
                HttpResponse.BodyHandlers.ofString()).body();
        Map<String, Double> out = new HashMap<>();
        for (String line : text.split("\n")) {
            if (!line.isEmpty() && !line.startsWith("#")) {
                int sp = line.lastIndexOf(' ');
                out.put(line.substring(0, sp), Double.parseDouble(line.substring(sp + 1)));
            }
        }
        return out;
    }

    public double metric(String name) throws IOException, InterruptedException {
        return metrics().getOrDefault(name, 0.0);
    }

    @Override
    public void close() throws Exception {
        stop();
        if ("1".equals(System.getenv("DECREE_JAVA_KEEP"))) {
            System.err.println("kept " + dir);
            return;
        }
        try (Stream<Path> walk = Files.walk(dir)) {
            walk.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
    }
}
