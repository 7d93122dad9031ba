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

    @BeforeAll
    static void setUp() throws Exception {
        pki = TestPki.make();
        port = DecreeServer.freePort();
        String extra = TestPki.serverConfig(pki, port);
        server = DecreeServer.dummyWith(extra, "d1", "d2").start();
    }

    @AfterAll
    static void tearDown() throws Exception {
        if (server != null) {
            server.close();
        }
        if (pki != null) {
            TestPki.delete(pki);
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
            FakeResource.enlist(tm, new FakeResource("d1", journal), new FakeResource("d2", journal));
            tm.commit();
            assertEquals(FakeResource.TWO_PHASE_COMMIT, journal);
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
