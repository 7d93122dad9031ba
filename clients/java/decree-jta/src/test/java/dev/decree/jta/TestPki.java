package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * A throwaway CA made with the {@code openssl} command: ca.pem, a server certificate for
 * 127.0.0.1 (server.pem/key), and client certificates app-1 and app-2 (PKCS#8 keys).
 */
public final class TestPki {
    private TestPki() {}

    static void openssl(Path dir, String... args) throws Exception {
        List<String> cmd = new ArrayList<>(List.of("openssl"));
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).directory(dir.toFile()).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        assertEquals(0, p.waitFor(), "openssl " + String.join(" ", args) + ": " + out);
    }

    /** Makes the files in a new directory under the build directory and returns it. */
    public static Path make() throws Exception {
        try {
            new ProcessBuilder("openssl", "version").start().waitFor();
        } catch (java.io.IOException e) {
            TestEnv.need("the openssl command", "install openssl to make the test certificates");
        }
        Path pki = Files.createTempDirectory(Files.createDirectories(TestEnv.repo().resolve("target")), "decree-java-pki-");
        openssl(pki, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key",
                "-out", "ca.pem", "-days", "2", "-subj", "/CN=decree-test-ca");
        for (String[] c : new String[][] {{"server", "subjectAltName=IP:127.0.0.1,DNS:localhost"}, {"app-1", "subjectAltName=DNS:app-1"},
                {"app-2", "subjectAltName=DNS:app-2"}}) {
            openssl(pki, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", c[0] + ".key", "-out",
                    c[0] + ".csr", "-subj", "/CN=" + c[0]);
            Files.writeString(pki.resolve(c[0] + ".ext"), c[1] + "\n");
            openssl(pki, "x509", "-req", "-in", c[0] + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
                    c[0] + ".pem", "-days", "2", "-extfile", c[0] + ".ext");
        }
        return pki;
    }

    /** The server configuration lines for a TLS listener on {@code port} that allows app-1. */
    public static String serverConfig(Path pki, int port) {
        return "tcp = \"127.0.0.1:" + port + "\"\n[tls]\ncert = \"" + pki.resolve("server.pem") + "\"\nkey = \""
                + pki.resolve("server.key") + "\"\nclient_ca = \"" + pki.resolve("ca.pem") + "\"\nclients_allowed = [\"app-1\"]\n";
    }

    public static void delete(Path pki) throws Exception {
        try (var files = Files.walk(pki)) {
            files.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        }
    }
}
