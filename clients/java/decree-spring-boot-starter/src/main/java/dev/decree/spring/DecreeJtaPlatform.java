package dev.decree.spring;

import dev.decree.jta.DecreeTransactionManager;
import jakarta.transaction.Status;
import jakarta.transaction.Synchronization;
import jakarta.transaction.SystemException;
import jakarta.transaction.Transaction;
import jakarta.transaction.TransactionManager;
import jakarta.transaction.UserTransaction;
import org.hibernate.engine.transaction.jta.platform.spi.JtaPlatform;

/**
 * Hibernate's {@link JtaPlatform} for decree-jta: Hibernate registers its synchronizations as
 * interposed ones (they run after the application's in beforeCompletion, before them in
 * afterCompletion). Set {@code hibernate.transaction.jta.platform} to an instance, or to this
 * class's name: the no-argument constructor takes the transaction manager the Spring Boot
 * auto-configuration (or {@link #use}) made the default.
 */
public class DecreeJtaPlatform implements JtaPlatform {
    private static volatile DecreeTransactionManager fallback;
    private final DecreeTransactionManager explicit;

    /** Makes {@code tm} the transaction manager of platforms created by name. */
    public static void use(DecreeTransactionManager tm) {
        fallback = tm;
    }

    public DecreeJtaPlatform() {
        this.explicit = null;
    }

    public DecreeJtaPlatform(DecreeTransactionManager tm) {
        this.explicit = tm;
    }

    private DecreeTransactionManager tm() {
        DecreeTransactionManager tm = explicit != null ? explicit : fallback;
        if (tm == null) {
            throw new IllegalStateException("DecreeJtaPlatform: no DecreeTransactionManager (call DecreeJtaPlatform.use(tm) or pass one)");
        }
        return tm;
    }

    @Override
    public TransactionManager retrieveTransactionManager() {
        return tm();
    }

    @Override
    public UserTransaction retrieveUserTransaction() {
        return tm();
    }

    @Override
    public Object getTransactionIdentifier(Transaction transaction) {
        return transaction;
    }

    @Override
    public boolean canRegisterSynchronization() {
        return tm().getSynchronizationRegistry().getTransactionStatus() == Status.STATUS_ACTIVE;
    }

    @Override
    public void registerSynchronization(Synchronization synchronization) {
        tm().getSynchronizationRegistry().registerInterposedSynchronization(synchronization);
    }

    @Override
    public int getCurrentStatus() throws SystemException {
        return tm().getStatus();
    }
}
