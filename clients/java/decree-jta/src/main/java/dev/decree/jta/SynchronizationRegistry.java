package dev.decree.jta;

import jakarta.transaction.Status;
import jakarta.transaction.Synchronization;
import jakarta.transaction.TransactionSynchronizationRegistry;

/**
 * The {@link TransactionSynchronizationRegistry} of a {@link DecreeTransactionManager}: per
 * transaction resources, rollback-only, and interposed synchronizations, whose
 * {@code beforeCompletion} runs after every synchronization registered on the transaction
 * and whose {@code afterCompletion} runs before them (as JPA providers need).
 */
final class SynchronizationRegistry implements TransactionSynchronizationRegistry {
    private final DecreeTransactionManager tm;

    SynchronizationRegistry(DecreeTransactionManager tm) {
        this.tm = tm;
    }

    private DecreeTransaction required(String call) {
        DecreeTransaction tx = tm.currentTransaction();
        if (tx == null) {
            throw new IllegalStateException(call + ": this thread has no transaction");
        }
        return tx;
    }

    @Override
    public Object getTransactionKey() {
        DecreeTransaction tx = tm.currentTransaction();
        return tx == null ? null : tx.xid();
    }

    @Override
    public void putResource(Object key, Object value) {
        if (key == null) {
            throw new NullPointerException("putResource: null key");
        }
        DecreeTransaction tx = required("putResource");
        synchronized (tx.resourceMap()) {
            tx.resourceMap().put(key, value);
        }
    }

    @Override
    public Object getResource(Object key) {
        if (key == null) {
            throw new NullPointerException("getResource: null key");
        }
        DecreeTransaction tx = required("getResource");
        synchronized (tx.resourceMap()) {
            return tx.resourceMap().get(key);
        }
    }

    @Override
    public void registerInterposedSynchronization(Synchronization sync) {
        required("registerInterposedSynchronization").registerInterposed(sync);
    }

    @Override
    public int getTransactionStatus() {
        DecreeTransaction tx = tm.currentTransaction();
        return tx == null ? Status.STATUS_NO_TRANSACTION : tx.getStatus();
    }

    @Override
    public void setRollbackOnly() {
        required("setRollbackOnly").setRollbackOnly();
    }

    @Override
    public boolean getRollbackOnly() {
        return required("getRollbackOnly").rollbackOnly();
    }
}
