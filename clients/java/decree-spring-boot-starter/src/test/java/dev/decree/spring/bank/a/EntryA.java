package dev.decree.spring.bank.a;

import jakarta.persistence.Entity;
import jakarta.persistence.Id;
import jakarta.persistence.Table;

/** A ledger entry in database A. */
@Entity
@Table(name = "decree_spring_entry")
public class EntryA {
    @Id
    private String id;
    private long amount;

    protected EntryA() {}

    public EntryA(String id, long amount) {
        this.id = id;
        this.amount = amount;
    }

    public String getId() {
        return id;
    }

    public long getAmount() {
        return amount;
    }
}
