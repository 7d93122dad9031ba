package dev.decree.spring.bank.b;

import jakarta.persistence.Entity;
import jakarta.persistence.Id;
import jakarta.persistence.Table;

/** A ledger entry in database B. */
@Entity
@Table(name = "decree_spring_entry")
public class EntryB {
    @Id
    private String id;
    private long amount;

    protected EntryB() {}

    public EntryB(String id, long amount) {
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
