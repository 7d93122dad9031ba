package dev.decree.jta;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.transaction.SystemException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Sessions over TLS 1.3 with a client certificate (docs/protocol.md, "TLS"): a throwaway CA
 * made with the {@code openssl} command, a server certificate for 127.0.0.1, and two client
 * certificates of which the server allows one.
 */
class TlsTest {
    static Path pki;
    static DecreeServer server;
    static int port;

    static void openssl(Path dir, String... args) throws Exception {
        List<String> cmd = new java.util.ArrayList<>(List.of("openssl"));
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).directory(dir.toFile()).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        assertEquals(0, p.waitFor(), "openssl " + String.join(" ", args) + ": " + out);
    }

    @BeforeAll
    static void setUp() throws Exception {
        try {
            new ProcessBuilder("openssl", "version").start().waitFor();
        } catch (java.io.IOException e) {
            TestEnv.need("the openssl command", "install openssl to make the test certificates");
        }
        pki = Files.createTempDirectory(Files.createDirectories(TestEnv.repo().resolve("target")), "decree-java-pki-");
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
        port = DecreeServer.freePort();
        String extra = "tcp = \"127.0.0.1:" + port + "\"\n[tls]\ncert = \"" + pki.resolve("server.pem") + "\"\nkey = \""
                + pki.resolve("server.key") + "\"\nclient_ca = \"" + pki.resolve("ca.pem") + "\"\nclients_allowed = [\"app-1\"]\n";
        server = new DecreeServer(List.of(new DecreeServer.Rm("d1", "dummy", null), new DecreeServer.Rm("d2", "dummy", null)), extra)
                .start();
    }

    @AfterAll
    static void tearDown() throws Exception {
        if (server != null) {
            server.close();
        }
        if (pki != null) {
            try (var files = Files.walk(pki)) {
                files.sorted(java.util.Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            }
        }
    }

    static SessionOptions as(String client) {
        return SessionOptions.defaults().withSslContext(Tls.context(pki.resolve("ca.pem"), pki.resolve(client + ".pem"),
                pki.resolve(client + ".key")));
    }

    @Test
    void aTwoPhaseCommitOverMutualTls() throws Exception {
        try (DecreeTransactionManager tm = DecreeTransactionManager.connect("tls:127.0.0.1:" + port, as("app-1"))) {
            tm.setParallelBranchCalls(false);
            List<String> journal = FakeResource.journal();
            tm.begin();
            DecreeXid xid = ((DecreeTransaction) tm.getTransaction()).xid();
            tm.getTransaction().enlistResource(new FakeResource("d1", journal));
            tm.getTransaction().enlistResource(new FakeResource("d2", journal));
            tm.commit();
            assertEquals(List.of("start 0", "start 1", "end 0", "end 1", "prepare 0", "prepare 1", "commit 0", "commit 1"), journal);
            assertEquals(Outcome.COMMITTED, tm.outcome(xid));
        }
    }

    @Test
    void aCertificateWhoseNameIsNotAllowedIsRefusedWithErrorNotAllowed() {
        SystemException e = assertThrows(SystemException.class, () -> DecreeTransactionManager.connect("tls:127.0.0.1:" + port, as("app-2")));
        assertTrue(e.getMessage().contains("NotAllowed") && e.getMessage().contains("app-2"), e.getMessage());
    }

    @Test
    void aTlsEndpointWithoutTlsSettingsSaysWhatIsMissing() {
        SystemException e = assertThrows(SystemException.class, () -> DecreeTransactionManager.connect("tls:127.0.0.1:" + port));
        assertTrue(e.getMessage().contains("needs TLS settings"), e.getMessage());
    }
}
