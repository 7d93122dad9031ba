package dev.decree.spring.bank.b;

import dev.decree.spring.bank.Entry;
import jakarta.persistence.Entity;
import jakarta.persistence.Table;

/** A ledger entry in database B (the persistence unit b scans this package). */
@Entity
@Table(name = "decree_spring_entry")
public class EntryB extends Entry {
    protected EntryB() {}

    public EntryB(String id, long amount) {
        super(id, amount);
    }
}
