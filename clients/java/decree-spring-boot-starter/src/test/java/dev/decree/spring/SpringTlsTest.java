package dev.decree.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.decree.jta.Bank;
import dev.decree.jta.DecreeServer;
import dev.decree.jta.DecreeTransactionManager;
import dev.decree.jta.TestEnv;
import dev.decree.jta.TestPki;
import dev.decree.spring.bank.BankApplication;
import java.nio.file.Path;
import java.util.List;
import java.util.UUID;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;

/**
 * The starter's TLS properties: the bank application talks to the server over TLS 1.3 with
 * a client certificate ({@code decree.endpoint=tls:...}, {@code decree.tls.ca/cert/key}) and
 * a {@code @Transactional} transfer commits in both databases.
 */
@SpringBootTest(classes = BankApplication.class)
class SpringTlsTest {
    static Path pki;
    static SpringBanks banks;

    @DynamicPropertySource
    static void properties(DynamicPropertyRegistry r) throws Exception {
        pki = TestPki.make();
        int port = DecreeServer.freePort();
        banks = new SpringBanks(TestPki.serverConfig(pki, port));
        r.add("decree.endpoint", () -> "tls:127.0.0.1:" + port);
        r.add("decree.tls.ca", () -> pki.resolve("ca.pem").toString());
        r.add("decree.tls.cert", () -> pki.resolve("app-1.pem").toString());
        r.add("decree.tls.key", () -> pki.resolve("app-1.key").toString());
        banks.register(r);
    }

    @AfterAll
    static void stop() throws Exception {
        if (banks != null) {
            banks.close();
        }
        if (pki != null) {
            TestPki.delete(pki);
        }
    }

    @Autowired
    BankApplication.Transfers transfers;

    @Autowired
    DecreeTransactionManager tm;

    @Test
    void aTransferCommitsOverTls() throws Exception {
        assertTrue(tm.endpoint().toString().startsWith("tls:"), tm.endpoint().toString());
        String id = UUID.randomUUID().toString();
        transfers.move(id, 3);
        assertTrue(transfers.inA(id) && transfers.inB(id));
        assertEquals(List.of(), banks.awaitNothingPrepared());
    }
}
