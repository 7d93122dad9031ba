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
import org.junit.jupiter.api.AutoClose;
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
    @AutoClose
    static SpringBanks banks;

    @DynamicPropertySource
    static void properties(DynamicPropertyRegistry r) throws Exception {
        banks = new SpringBanks("");
        r.add("decree.endpoint", banks.server::endpoint);
        banks.register(r);
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
        assertEquals(List.of(), banks.awaitNothingPrepared());
    }

    @Test
    void aTransactionalMethodThatThrowsAfterWritingBothRollsBackBoth() throws Exception {
        String id = UUID.randomUUID().toString();
        assertThrows(IllegalStateException.class, () -> transfers.moveThenFail(id, 5));
        assertFalse(transfers.inA(id) || transfers.inB(id));
        assertEquals(List.of(), banks.awaitNothingPrepared());
    }
}
