package dev.decree.spring.bank;

import jakarta.persistence.Id;
import jakarta.persistence.MappedSuperclass;

/**
 * A ledger entry: {@link dev.decree.spring.bank.a.EntryA} in database A,
 * {@link dev.decree.spring.bank.b.EntryB} in B (the tests read the rows by id, with
 * {@code EntityManager.find} or SQL: no getters).
 */
@MappedSuperclass
public abstract class Entry {
    @Id
    private String id;
    private long amount;

    protected Entry() {}

    protected Entry(String id, long amount) {
        this.id = id;
        this.amount = amount;
    }
}
