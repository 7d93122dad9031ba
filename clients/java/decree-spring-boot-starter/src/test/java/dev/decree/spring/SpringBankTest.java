package dev.decree.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.decree.jta.DecreeDataSource;
import dev.decree.jta.DecreeServer;
import dev.decree.jta.TestEnv;
import dev.decree.spring.bank.BankApplication;
import java.util.List;
import java.util.UUID;
import javax.sql.DataSource;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.beans.factory.annotation.Qualifier;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.test.context.DynamicPropertyRegistry;
import org.springframework.test.context.DynamicPropertySource;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.transaction.jta.JtaTransactionManager;

/**
 * The starter in a Spring Boot application with two DataSources (PostgreSQL and MariaDB)
 * and JPA entities in both, against a real {@code decree serve}: a {@code @Transactional}
 * method that writes both commits both; one that writes both and then throws rolls back
 * both; nothing is left prepared.
 */
@SpringBootTest(classes = BankApplication.class)
class SpringBankTest {
    static TestEnv.Db pgA;
    static TestEnv.Db maria;
    static DecreeServer server;

    @DynamicPropertySource
    static void properties(DynamicPropertyRegistry r) throws Exception {
        pgA = TestEnv.pg("pg-a", "DECREE_TEST_PG_A");
        maria = TestEnv.maria("maria", "DECREE_TEST_MARIADB");
        server = new DecreeServer(List.of(new DecreeServer.Rm("pg-a", "postgres", pgA.dsn()),
                new DecreeServer.Rm("maria", "mariadb", maria.dsn())), "").start();
        r.add("decree.endpoint", server::endpoint);
        r.add("decree.datasource.bankA.url", pgA::jdbcUrl);
        r.add("decree.datasource.bankA.username", () -> pgA.properties().getProperty("user"));
        r.add("decree.datasource.bankA.rm", () -> "pg-a");
        r.add("decree.datasource.bankB.url", maria::jdbcUrl);
        r.add("decree.datasource.bankB.username", () -> maria.properties().getProperty("user"));
        r.add("decree.datasource.bankB.rm", () -> "maria");
    }

    @AfterAll
    static void stop() throws Exception {
        if (server != null) {
            server.close();
        }
    }

    @Autowired
    BankApplication.Transfers transfers;

    @Autowired
    PlatformTransactionManager transactionManager;

    @Autowired
    @Qualifier("bankA")
    DataSource bankA;

    @Test
    void theAutoConfigurationGivesAJtaTransactionManagerAndDecreeDataSources() {
        assertInstanceOf(JtaTransactionManager.class, transactionManager);
        assertInstanceOf(DecreeDataSource.class, bankA);
        assertEquals("pg-a", ((DecreeDataSource) bankA).rmName());
    }

    @Test
    void aTransactionalMethodThatWritesBothDatabasesCommitsBoth() throws Exception {
        String id = UUID.randomUUID().toString();
        transfers.move(id, 5);
        assertTrue(transfers.inA(id) && transfers.inB(id));
        assertEquals(List.of(), dev.decree.jta.Bank.awaitNothingPrepared(server.node, 10, pgA, maria));
    }

    @Test
    void aTransactionalMethodThatThrowsAfterWritingBothRollsBackBoth() throws Exception {
        String id = UUID.randomUUID().toString();
        assertThrows(IllegalStateException.class, () -> transfers.moveThenFail(id, 5));
        assertFalse(transfers.inA(id) || transfers.inB(id));
        assertEquals(List.of(), dev.decree.jta.Bank.awaitNothingPrepared(server.node, 10, pgA, maria));
    }
}
